"""The retention purge: deletes turns older than CLAWHUB_RETENTION_DAYS with their judgments and samples.

Run it periodically from Celery beat (daily is enough). Idempotent by nature: a second run finds nothing
older than the cutoff.
"""

from clawhub.core import task_names as tasks
from workers.celery import app


@app.task(name=tasks.RETENTION_PURGE, queue=tasks.HOUSEKEEPING_QUEUE)
def purge() -> dict:
    from clawhub.conversations.privacy import turns_purge_older_than

    return {"turns_deleted": turns_purge_older_than()}
