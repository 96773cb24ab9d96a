import os
import socket

from clawhub.core import tasks
from workers.celery import app


@app.task(name=tasks.HEALTH_PING, queue=tasks.DEFAULT_QUEUE)
def ping(token: str) -> dict:
    """Answers with the token and where it ran, which proves a worker process picked the task up."""
    return {"token": token, "hostname": socket.gethostname(), "pid": os.getpid()}
