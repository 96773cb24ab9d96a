from clawhub.core import tasks
from clawhub.core.generations import generations_bump_pending
from workers.celery import app


@app.task(name=tasks.GENERATIONS_SWEEP, queue=tasks.HOUSEKEEPING_QUEUE, ignore_result=True)
def bump_pending_generations() -> int:
    """Periodic: the generation bumps the shared cache did not take when their change committed."""
    return generations_bump_pending()
