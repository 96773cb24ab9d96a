"""The Celery app. Configured from Django settings (CELERY_*): Redis in production, a broker on the local disk
in the embedded default, so a real worker process runs without any server."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clawhub.settings.base")

app = Celery("clawhub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue="default",
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.autodiscover_tasks(["workers.tasks"], related_name=None)
