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
