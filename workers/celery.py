"""The Celery app of the workers and beat (``celery -A workers.celery``): the app every process sends through
(``clawhub.core.celery_app``), with the beat schedule (all of it, here) and the task modules."""

from django.conf import settings

from clawhub.core import task_names as tasks
from clawhub.core.celery_app import app

__all__ = ["app"]

app.conf.update(
    # `celery -A workers.celery beat`. The idle sweep closes sessions and hands their last turns to judging.
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
        # Runs for tenants with a full batch approved.
        "train-kick": {
            "task": tasks.TRAIN_KICK,
            "schedule": settings.CLAWHUB_TRAIN_KICK_SECONDS,
            "options": {"queue": tasks.HOUSEKEEPING_QUEUE, "expires": settings.CLAWHUB_TRAIN_KICK_SECONDS},
        },
        # Candidates and evaluations a lost worker forgot, promotions that gave up, their pre-loads.
        "promotion-sweep": {
            "task": tasks.PROMOTION_SWEEP,
            "schedule": settings.CLAWHUB_SWEEP_SECONDS,
            "options": {"queue": tasks.HOUSEKEEPING_QUEUE, "expires": settings.CLAWHUB_SWEEP_SECONDS},
        },
        # The switch schedules each unload with a countdown; this sweep catches any a lost worker dropped.
        "unload-drained-adapters": {
            "task": tasks.UNLOAD_DRAINED,
            "schedule": 60.0,
            "options": {"queue": tasks.HOUSEKEEPING_QUEUE, "expires": 60},
        },
        # Generation bumps the shared cache did not take (it was away when the change committed).
        "bump-pending-generations": {
            "task": tasks.GENERATIONS_SWEEP,
            "schedule": 30.0,
            "options": {"queue": tasks.HOUSEKEEPING_QUEUE, "expires": 30},
        },
    },
)
app.autodiscover_tasks(["workers.tasks"], related_name=None)
