"""gunicorn settings for the web/gateway image: ``gunicorn clawhub.asgi:application -c deploy/gunicorn.conf.py
-k uvicorn.workers.UvicornWorker``. Everything here can be overridden with GUNICORN_CMD_ARGS or the
environment variables gunicorn reads itself (WEB_CONCURRENCY, FORWARDED_ALLOW_IPS)."""

import os
import shutil
from pathlib import Path

bind = os.environ.get("CLAWHUB_BIND", "0.0.0.0:8000")
# Async workers: one per core is enough; each holds many concurrent streams.
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "uvicorn.workers.UvicornWorker"
# For async workers this is a heartbeat, not a request limit: a 10-minute stream does not trip it.
timeout = 60
# On a rolling update a worker stops taking new requests and gets this long to finish its open streams;
# keep it at or below the pod's terminationGracePeriodSeconds.
graceful_timeout = int(os.environ.get("CLAWHUB_GRACEFUL_TIMEOUT", "600"))
# Longer than nginx's upstream keepalive_timeout (60 s), so nginx closes idle connections first and never
# sends a request on a socket gunicorn is closing.
keepalive = 75
# uvicorn rewrites the client address from X-Forwarded-For only for these peers (nginx, the ingress).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
accesslog = None  # ClawHub logs each request itself, as JSON with its request id
errorlog = "-"
loglevel = os.environ.get("CLAWHUB_LOG_LEVEL", "INFO").lower()


def on_starting(server):
    # prometheus_client's multiprocess mode adds up every file in this folder: files from an earlier run would
    # be counted again, so start from an empty folder.
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        path = Path(folder)
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        path.mkdir(parents=True, exist_ok=True)


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        # Drops the dead worker's live gauges; its counters stay in the totals.
        multiprocess.mark_process_dead(worker.pid)
