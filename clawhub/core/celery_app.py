"""The Celery app, as every process sends through it: configured from Django settings (CELERY_*), Redis in
production, a broker on the local disk in the embedded default, so a real worker process runs without any
server. Every task name has its route (``clawhub.core.task_names``).

It lives in core so that senders (``clawhub.core.tasks``) reach it without importing the task layer; workers
and beat load it through ``workers.celery`` (``celery -A workers.celery``), which adds the beat schedule and
the task modules.
"""

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
)
