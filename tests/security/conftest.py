"""Fixtures the security tests share with the areas they attack."""

from tests.training.conftest import sent  # noqa: F401 (Celery's send_task, recorded)
