"""The production settings under gunicorn + uvicorn workers, as deploy/README.md runs them locally.

One real server (deploy/gunicorn.conf.py, two workers) on the pytest-django test database, a throwaway
redis-server of its own as broker and cache (so stopping it disturbs nobody), Prometheus in multiprocess mode,
and the gateway in front of the fake upstream. Checked: /healthz, /readyz failing while the broker is down and
passing again once it is back, and /metrics counters moving after a request through /v1.
"""

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.factories import make_key
from tests.gateway.conftest import start_fake, wait_until
from tests.gateway.durability import ThrowawayRedis
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = ROOT / ".venv" / "bin" / "gunicorn"
METRICS_TOKEN = "metrics-token-for-the-test"


def database_url() -> str:
    """The test database (test_<name>), which the server must share with this test."""
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def redis_server(tmp_path):
    server = ThrowawayRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream():
    fake = start_fake(FAKE_LOAD_DELAY="0")
    yield fake
    fake.stop()


@pytest.fixture
def production_server(tmp_path, redis_server, upstream):
    assert GUNICORN.exists(), f"{GUNICORN} is missing: ./dev test installs it"
    port = free_port()
    prometheus_dir = tmp_path / "prometheus"
    prometheus_dir.mkdir()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "clawhub.settings.production",
        "DJANGO_SECRET_KEY": "production-server-test-" + os.urandom(24).hex(),  # >= 50 chars
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DATABASE_URL": database_url(),
        "REDIS_URL": f"{redis_server.url}/0",
        "CELERY_BROKER_URL": f"{redis_server.url}/1",
        "CLAWHUB_SECURE_COOKIES": "false",
        "CLAWHUB_UPSTREAMS": json.dumps([{"url": upstream.url, "base_model": "tiny", "max_adapters": 4}]),
        "PROMETHEUS_MULTIPROC_DIR": str(prometheus_dir),
        "METRICS_TOKEN": METRICS_TOKEN,
        "METRICS_ALLOWED_NETS": "",  # the token is the only way in, even from 127.0.0.1
        "CLAWHUB_BIND": f"127.0.0.1:{port}",
        "WEB_CONCURRENCY": "2",  # two workers: /metrics must add up both processes' files
        "CLAWHUB_GRACEFUL_TIMEOUT": "5",
        "CLAWHUB_CAPTURE_SPOOL_DIR": str(tmp_path / "capture"),  # never the repository's var/
    }
    log_path = tmp_path / "gunicorn.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(GUNICORN), "clawhub.asgi:application", "-c", "deploy/gunicorn.conf.py"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"gunicorn exited: {log_path.read_text(errors='replace')[-3000:]}")
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=60, interval=0.2)
        yield base, log_path
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def metric(base: str, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when there is none yet)."""
    response = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
    assert response.status_code == 200, response.text
    total = 0.0
    for line in response.text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(match.group(2))
    return total


def ready(base: str) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=10)


@pytest.mark.django_db(transaction=True)
def test_production_server_health_readiness_and_metrics(production_server, redis_server):
    base, log_path = production_server

    health = httpx.get(f"{base}/healthz", timeout=5)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    response = ready(base)
    assert response.status_code == 200, response.text
    checks = response.json()["checks"]
    assert checks["database"]["ok"] and checks["broker"] == {"ok": True, "kind": "redis"}
    assert checks["upstreams"] == {"ok": True, "configured": 1, "healthy": 1}

    # The broker goes away: not ready, and the body says which check failed.
    redis_server.stop()
    response = ready(base)
    assert response.status_code == 503 and response.json()["failed"] == ["broker"]
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200  # alive all the same
    redis_server.start()
    assert wait_until(lambda: ready(base).status_code == 200, timeout=15)

    # /metrics needs the token; its counters move after one request through the gateway.
    assert httpx.get(f"{base}/metrics", timeout=5).status_code == 403
    labels = {"route": "chat", "model": "base", "status": "200"}
    before = metric(base, "clawhub_gateway_requests_total", **labels)
    tokens_before = metric(base, "clawhub_gateway_tokens_total", kind="completion", model="base")
    _, secret = make_key()
    answer = httpx.post(f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                        json={"model": "base", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"]
    # Counted by the worker's writer thread shortly after the response, into its multiprocess file.
    wait_until(lambda: metric(base, "clawhub_gateway_requests_total", **labels) == before + 1, timeout=10)
    completion = answer.json()["usage"]["completion_tokens"]
    assert metric(base, "clawhub_gateway_tokens_total", kind="completion", model="base") == \
        tokens_before + completion
    assert metric(base, "clawhub_gateway_request_duration_seconds_count", route="chat", model="base") >= 1
    assert "Traceback" not in log_path.read_text(errors="replace")
