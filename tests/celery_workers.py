"""Real Celery worker processes for the end-to-end tests, on the test's own database and broker."""

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]
# Short, so a test that kills a worker sees its unacknowledged message delivered again within seconds.
VISIBILITY_TIMEOUT = 3


def start_worker(app: str, queue: str, *options: str, **env: str) -> subprocess.Popen:
    """``celery -A app worker -Q queue *options``; ``env`` adds to or overrides its environment."""
    db = settings.DATABASES["default"]
    # The worker must see this test's rows: the test database, not the one DATABASE_URL names.
    database_url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queue, *options, "--loglevel", "WARNING",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "clawhub.settings.test", "DATABASE_URL": database_url,
             "CELERY_BROKER_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT), **env},
    )


def stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
