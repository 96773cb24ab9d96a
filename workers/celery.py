"""The Celery app. Configured from Django settings (CELERY_*): Redis in production, a broker on the local disk
in the embedded default, so a real worker process runs without any server."""

import os

from celery import Celery

from clawhub.core import logging as ops_logging
from clawhub.core import metrics as ops_metrics
from clawhub.core import task_names as tasks

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clawhub.settings.base")

app = Celery("clawhub")
# Request ids follow a request into its tasks, and task durations are exported; both hook Celery's signals.
ops_logging.connect_celery_signals()
ops_metrics.connect_celery_signals()
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue="default",
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # Judging runs on many CPU workers, training on GPU workers, periodic bookkeeping next to judging but on a
    # queue of its own: every task name has its queue (clawhub.core.tasks), so one sent by name lands there.
    task_routes={name: {"queue": queue} for name, queue in tasks.TASK_QUEUES.items()},
    # `celery -A workers.celery beat`: the idle sweep closes sessions and hands their last turns to judging.
    beat_schedule={
        "close-idle-sessions": {
            "task": tasks.CLOSE_IDLE,
            "schedule": 60.0,
            "options": {"queue": tasks.JUDGE_QUEUE, "expires": 60},
        },
        # Ready turns whose judge task was lost (publish failed, broker restarted) are judged later.
        "sweep-unjudged-turns": {
            "task": tasks.JUDGE_SWEEP,
            "schedule": 300.0,
            "options": {"queue": tasks.JUDGE_QUEUE, "expires": 300},
        },
        "purge-old-turns": {
            "task": tasks.RETENTION_PURGE,
            "schedule": 24 * 3600.0,
            "options": {"queue": tasks.HOUSEKEEPING_QUEUE, "expires": 3600},
        },
    },
)
app.autodiscover_tasks(["workers.tasks"], related_name=None)
