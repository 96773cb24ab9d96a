"""Sending Celery tasks, from the web side and from tasks alike: ``enqueue_on_commit`` (and ``enqueue``), by
task name.

Senders name a task (``clawhub.core.task_names``, re-exported here) instead of importing it, so no app imports
``workers.tasks`` (which import the apps back) and the Celery app is loaded only when something is sent.
The app (``clawhub.core.celery_app``) routes every name in ``TASK_QUEUES`` to its queue, so a task sent by
name lands where its worker listens; the task modules declare the same queues (tests/workers checks that
they agree).
"""

from collections.abc import Callable
from typing import Any

from django.db import transaction

from clawhub.core.task_names import (  # re-exported: senders write tasks.JUDGE_TURN
    ACCOUNT_MAIL,
    CLOSE_IDLE,
    DEFAULT_QUEUE,
    GENERATIONS_SWEEP,
    HEALTH_PING,
    HOUSEKEEPING_QUEUE,
    JUDGE_QUEUE,
    JUDGE_SWEEP,
    JUDGE_TURN,
    JUDGE_TURNS,
    PROMOTE,
    PROMOTION_SWEEP,
    QUEUES,
    RETENTION_PURGE,
    TASK_QUEUES,
    TRAIN_KICK,
    TRAIN_QUEUE,
    TRAIN_RUN,
    UNLOAD_DRAINED,
)

__all__ = [
    "enqueue", "enqueue_on_commit", "JUDGE_QUEUE", "TRAIN_QUEUE", "HOUSEKEEPING_QUEUE", "DEFAULT_QUEUE",
    "QUEUES", "JUDGE_TURN", "JUDGE_TURNS", "JUDGE_SWEEP", "CLOSE_IDLE", "TRAIN_RUN", "PROMOTE", "TRAIN_KICK",
    "PROMOTION_SWEEP", "UNLOAD_DRAINED", "RETENTION_PURGE", "HEALTH_PING", "ACCOUNT_MAIL", "TASK_QUEUES",
    "GENERATIONS_SWEEP",
]


def enqueue(task_name: str, *ids: int, queue: str | None = None, countdown: float | None = None,
            producer: Any = None, **kwargs: Any) -> Any:
    """Sends the task now and returns Celery's AsyncResult. Tasks take ids (and plain keyword values) and
    re-read their rows. Without ``queue`` the task goes to its queue in TASK_QUEUES (the Celery app's
    routes). ``producer``: the kombu producer to send through, one for many sends (a fan-out)."""
    if task_name not in TASK_QUEUES:
        raise ValueError(f"unknown task {task_name!r}: add it to clawhub.core.tasks.TASK_QUEUES")
    from clawhub.core.celery_app import app  # the Celery app loads only when a task is sent

    options: dict[str, Any] = {}
    if countdown:
        options["countdown"] = countdown
    if queue:
        options["queue"] = queue
    if producer is not None:
        options["producer"] = producer
    return app.send_task(task_name, args=list(ids), kwargs=kwargs, **options)


def enqueue_on_commit(task_name: str, *ids: int, queue: str | None = None, countdown: float | None = None,
                      then: Callable[[Any], None] | None = None, **kwargs: Any) -> None:
    """Sends the task once the current transaction commits (at once outside one), so the task always finds
    the rows it is given. A failed send is logged by Django and does not undo the commit: the periodic sweeps
    re-drive what was lost. ``then`` receives the AsyncResult (to record the task id, say)."""
    if task_name not in TASK_QUEUES:  # fail in the caller, not in an on-commit callback that only logs
        raise ValueError(f"unknown task {task_name!r}: add it to clawhub.core.tasks.TASK_QUEUES")

    def send() -> None:
        result = enqueue(task_name, *ids, queue=queue, countdown=countdown, **kwargs)
        if then is not None:
            then(result)

    transaction.on_commit(send, robust=True)
