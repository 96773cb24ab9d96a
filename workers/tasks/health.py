import os
import socket

from workers.celery import app


@app.task(name="clawhub.health.ping", queue="default")
def ping(token: str) -> dict:
    """Answers with the token and where it ran, which proves a worker process picked the task up."""
    return {"token": token, "hostname": socket.gethostname(), "pid": os.getpid()}
