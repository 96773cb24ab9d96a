"""Celery tasks: the only bridge between Django (clawhub) and the Django-free judge and trainer code."""

from workers.tasks import health, judging, mail, promotion, retention, training  # noqa: F401
