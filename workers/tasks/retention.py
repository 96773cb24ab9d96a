"""The retention purge: deletes turns older than CLAWHUB_RETENTION_DAYS with their judgments and samples, and
empties the capture spool's stored records of deleted accounts (those acknowledged after the deletion).

Run it periodically from Celery beat (daily is enough). Idempotent by nature: a second run finds nothing
older than the cutoff.
"""

from clawhub.core import tasks
from workers.celery import app


@app.task(name=tasks.RETENTION_PURGE, queue=tasks.HOUSEKEEPING_QUEUE)
def purge() -> dict:
    from clawhub.conversations.privacy import turns_purge_older_than
    from clawhub.privacy.services import capture_spool_scrub_deleted

    return {"turns_deleted": turns_purge_older_than(), "spool_records_emptied": capture_spool_scrub_deleted()}
