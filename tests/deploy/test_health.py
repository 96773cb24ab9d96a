"""/healthz and /readyz: what they check, and that they answer the way probes reach them."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db.utils import OperationalError
from django.test import Client, override_settings

from clawhub.core import health
from tests.ports import free_port


@pytest.fixture
def client():
    return Client(enforce_csrf_checks=True)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def healthy_upstream():
    """A stand-in vLLM that answers GET /health with 200."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def dead_port():
    """A port nothing listens on."""
    return free_port()


@pytest.fixture
def silent_upstream():
    """Accepts connections (the kernel's backlog) but never answers: only a timeout gets the caller out."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


def test_healthz_is_ok_without_touching_the_database(client):
    # No db fixture: pytest-django fails any query, so a 200 proves /healthz does not need the database.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_probes_by_pod_ip_are_answered_despite_allowed_hosts(client, db):
    # Kubelet and Prometheus reach a pod by its IP, which is not in ALLOWED_HOSTS...
    assert client.get("/login/", HTTP_HOST="10.1.2.3:8000").status_code == 400
    # ...but the operational endpoints answer before host validation.
    assert client.get("/healthz", HTTP_HOST="10.1.2.3:8000").status_code == 200
    with override_settings(CLAWHUB_UPSTREAMS=[]):
        assert client.get("/readyz", HTTP_HOST="10.1.2.3:8000").status_code == 200


@override_settings(SECURE_SSL_REDIRECT=True)
def test_probes_are_not_redirected_to_https(client):
    assert client.get("/healthz").status_code == 200


def test_healthz_rejects_writes(client):
    assert client.post("/healthz").status_code == 405


@override_settings(CLAWHUB_UPSTREAMS=[])
def test_readyz_with_database_and_redis_up(client, db):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ok" and body["failed"] == []
    assert body["checks"]["database"]["ok"] and body["checks"]["broker"] == {"ok": True, "kind": "redis"}


def test_readyz_fails_when_the_broker_is_down(client, db, dead_port):
    with override_settings(
        CELERY_BROKER_URL=f"redis://:hunter2@127.0.0.1:{dead_port}/0", CLAWHUB_UPSTREAMS=[]
    ):
        started = time.monotonic()
        response = client.get("/readyz")
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["failed"] == ["broker"]
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["broker"]["ok"] is False
    # The body is public: no address or credential of the broker in it.
    assert str(dead_port) not in response.content.decode() and "hunter2" not in response.content.decode()
    assert elapsed < 3


def test_readyz_checks_the_filesystem_broker_folder(client, db, tmp_path):
    options = {"data_folder_in": str(tmp_path)}
    with override_settings(
        CELERY_BROKER_URL="filesystem://", CELERY_BROKER_TRANSPORT_OPTIONS=options, CLAWHUB_UPSTREAMS=[]
    ):
        assert client.get("/readyz").status_code == 200
    options = {"data_folder_in": str(tmp_path / "missing")}
    with override_settings(
        CELERY_BROKER_URL="filesystem://", CELERY_BROKER_TRANSPORT_OPTIONS=options, CLAWHUB_UPSTREAMS=[]
    ):
        response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["broker"]


def test_readyz_fails_when_the_database_does(client, db, monkeypatch):
    def broken():
        raise OperationalError("connection refused")

    monkeypatch.setattr(health, "check_database", broken)
    with override_settings(CLAWHUB_UPSTREAMS=[]):
        response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["database"]


def test_gateway_readiness_never_touches_the_database_and_the_web_apps_does(client, healthy_upstream):
    """A pod that serves /v1 stays ready through a database outage: the gateway serves known keys from its
    last good lookups. No db fixture: pytest-django fails any query, as a refused or hanging database
    would."""
    upstream = {"url": healthy_upstream, "base_model": "tiny", "max_adapters": 8, "api_key": ""}
    with override_settings(CLAWHUB_UPSTREAMS=[upstream]):
        gateway = client.get("/readyz/gateway")
        web = client.get("/readyz")
    assert gateway.status_code == 200, gateway.json()
    assert gateway["Cache-Control"] == "no-store"
    assert set(gateway.json()["checks"]) == {"upstreams", "capture"}
    assert web.status_code == 503 and web.json()["failed"] == ["database"]


def test_gateway_readiness_needs_one_healthy_upstream(client, dead_port):
    dead = {"url": f"http://127.0.0.1:{dead_port}", "base_model": "tiny", "max_adapters": 8, "api_key": ""}
    with override_settings(CLAWHUB_UPSTREAMS=[dead]):
        response = client.get("/readyz/gateway", HTTP_HOST="10.1.2.3:8000")  # by pod IP, as the kubelet asks
    assert response.status_code == 503 and response.json()["failed"] == ["upstreams"]


def test_readyz_needs_one_healthy_upstream(client, db, healthy_upstream, dead_port):
    dead = {"url": f"http://127.0.0.1:{dead_port}", "base_model": "tiny", "max_adapters": 8, "api_key": ""}
    alive = {**dead, "url": f"{healthy_upstream}/v1"}  # a /v1 suffix is tolerated: /health is at the root
    with override_settings(CLAWHUB_UPSTREAMS=[dead, alive]):
        response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["upstreams"] == {"ok": True, "configured": 2, "healthy": 1}
    with override_settings(CLAWHUB_UPSTREAMS=[dead]):
        response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["failed"] == ["upstreams"]


def test_readyz_gives_hanging_upstreams_one_short_timeout(client, db, silent_upstream):
    upstreams = [{"url": silent_upstream, "base_model": "tiny"}] * 5
    with override_settings(CLAWHUB_UPSTREAMS=upstreams):
        started = time.monotonic()
        response = client.get("/readyz")
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    # Five hanging upstreams are probed in parallel with a 1 s timeout each (one after another: over 5 s).
    assert 0.9 < elapsed < 3.5


def test_upstream_urls_accept_the_settings_shapes():
    with override_settings(CLAWHUB_UPSTREAMS='[{"url": "http://a:8000/v1/"}, "http://b:8000"]'):
        assert health.upstream_urls() == ["http://a:8000", "http://b:8000"]
