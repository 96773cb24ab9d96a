import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.worker
def test_health_task_runs_on_a_real_worker_over_redis(settings):
    """A separate worker process consumes the task from real Redis and its answer comes back."""
    from workers.celery import app

    assert settings.CELERY_BROKER_URL.startswith("redis://")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "clawhub.settings.test"}
    queue = f"health-{uuid.uuid4().hex[:8]}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery", "worker", "-Q", queue, "--pool", "solo",
         "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env,
    )
    try:
        token = uuid.uuid4().hex
        result = app.send_task("clawhub.health.ping", args=[token], queue=queue)
        answer = result.get(timeout=60)
        assert answer["token"] == token
        assert answer["pid"] != os.getpid()
    finally:
        worker.terminate()
        worker.wait(timeout=30)


SEND_AND_WAIT = """
import sys, uuid
from workers.celery import app
token = uuid.uuid4().hex
answer = app.send_task("clawhub.health.ping", args=[token], queue="default").get(timeout=90)
assert answer["token"] == token, answer
print("pid", answer["pid"])
"""


@pytest.mark.worker
def test_embedded_default_runs_a_real_worker_without_redis(tmp_path):
    """With no CELERY_BROKER_URL, tasks travel through a folder on disk to a real worker process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_"))}
    env.update(DJANGO_SETTINGS_MODULE="clawhub.settings.base", CLAWHUB_DATA_DIR=str(tmp_path))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery", "worker", "-Q", "default", "--pool", "solo",
         "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env,
    )
    try:
        sender = subprocess.run([sys.executable, "-c", SEND_AND_WAIT], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert sender.returncode == 0, sender.stderr
        worker_pid = int(sender.stdout.split()[-1])
        assert worker_pid == worker.pid
    finally:
        worker.terminate()
        worker.wait(timeout=30)
