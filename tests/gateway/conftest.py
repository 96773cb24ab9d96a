"""Fixtures for the gateway: vLLM-shaped fake upstreams (uvicorn subprocesses) and a gateway served by uvicorn
in a thread of this process, so tests go over real HTTP and can still see what reached capture_store.

Tests that use the gateway need committed rows (its database reads run on other threads and connections),
hence ``transactional_db``.
"""

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from django.conf import settings

from clawhub.adapters.models import AdapterVersion
from clawhub.conversations.capture.records import TurnRecord
from clawhub.gateway.app import Gateway
from clawhub.gateway.config import GatewayConfig
from tests.factories import make_key, make_user
from tests.ports import free_port


def inside_one_minute(seconds: float = 10) -> None:
    """Quotas count per fixed minute: if fewer than ``seconds`` are left of this one, wait for the next, so
    that the requests a test counts on all fall in one window (a boundary between them resets the count)."""
    left = 60 - time.time() % 60
    if left < seconds:
        time.sleep(left + 0.05)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


@dataclass
class FakeUpstream:
    url: str
    process: subprocess.Popen

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/_fake/stats").json()

    def reset(self) -> None:
        httpx.post(f"{self.url}/_fake/reset")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def start_fake(**env) -> FakeUpstream:
    port = free_port()
    environment = {**os.environ, "FAKE_LOAD_DELAY": "0.2", "FAKE_SLEEP": "5", **env}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "clawhub.devtools.fake_upstream:app", "--port", str(port),
         "--log-level", "warning", "--no-access-log"],
        env=environment,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=20)
    return FakeUpstream(url, process)


@pytest.fixture(scope="session")
def fake_upstream():
    fake = start_fake()
    yield fake
    fake.stop()


@pytest.fixture
def fake(fake_upstream):
    fake_upstream.reset()
    return fake_upstream


class CaptureSpy:
    """Stands in for capture_store (clawhub.conversations.capture.store) and keeps what the writer handed
    over."""

    def __init__(self):
        self.records: list[TurnRecord] = []
        self.batches = 0
        self._lock = threading.Lock()

    def __call__(self, batch: list[TurnRecord]) -> None:
        # Delivery from the hand-off is at least once, and capture_store skips request ids it has stored:
        # so does the spy.
        with self._lock:
            seen = {r.request_id for r in self.records}
            self.records.extend(r for r in batch if r.request_id not in seen)
            self.batches += 1

    def wait_for(self, count: int, timeout: float = 10.0) -> list[TurnRecord]:
        wait_until(lambda: len(self.records) >= count, timeout)
        return list(self.records)

    def last(self) -> TurnRecord:
        return self.wait_for(1)[-1]


@dataclass
class GatewayServer:
    url: str
    app: Gateway
    spy: CaptureSpy

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def serve_gateway(upstream_urls: list[str], *, max_adapters: int = 8, real_capture: bool = False,
                  with_web: bool = False, wrap=None, base_model: str = "tiny", **overrides):
    """``wrap``: given the ASGI app, returns the app to serve in its place (one that records traffic).
    ``base_model``: the name the upstreams serve their base model under."""
    spy = CaptureSpy()
    config = GatewayConfig.from_settings(
        upstreams=[{"url": u, "base_model": base_model, "max_adapters": max_adapters, "api_key": ""}
                   for u in upstream_urls],
        health_interval=overrides.pop("health_interval", 0.5),
        redis_url=overrides.pop("redis_url", settings.REDIS_URL),  # "": quotas in the process, as embedded
        **overrides,
    )
    app = Gateway(config, store=None if real_capture else spy)
    served = web_and(app) if with_web else app
    url, server, thread = serve_asgi(wrap(served) if wrap else served)
    return GatewayServer(url, app, spy), server, thread


def web_and(gateway: Gateway):
    """``gateway`` for /v1 and Django for the rest (/healthz…) on one event loop, as clawhub.asgi does."""
    from django.core.asgi import get_asgi_application

    web = get_asgi_application()

    async def application(scope, receive, send):
        if scope["type"] == "lifespan" or scope.get("path", "").startswith("/v1"):
            await gateway(scope, receive, send)
        else:
            await web(scope, receive, send)

    return application


def serve_asgi(app) -> tuple[str, uvicorn.Server, threading.Thread]:
    """``app`` served by uvicorn (with lifespan) in a thread of this process: its URL, server and thread."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=20)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture
def gateway_factory(transactional_db):
    running = []

    def make(upstream_urls: list[str], **overrides) -> GatewayServer:
        gw, server, thread = serve_gateway(upstream_urls, **overrides)
        running.append((server, thread))
        return gw

    yield make
    for server, thread in running:
        server.should_exit = True
        thread.join(20)


@pytest.fixture
def gateway(gateway_factory, fake) -> GatewayServer:
    return gateway_factory([fake.url])


def activate_adapter(tenant, version: int = 1, path: str | None = None, *, tell_gateways: bool = True,
                     ) -> AdapterVersion:
    """``tell_gateways``: bump the tenant's adapter generation, as the switch in adapter_activate does."""
    from clawhub.adapters.cache import adapter_cache_invalidate

    AdapterVersion.objects.filter(tenant=tenant, state=AdapterVersion.State.ACTIVE).update(
        state=AdapterVersion.State.RETIRED)
    row = AdapterVersion.objects.create(tenant=tenant, version=version, state=AdapterVersion.State.ACTIVE,
                                        artifact_path=path or f"/srv/adapters/t{tenant.pk}/v{version}")
    if tell_gateways:
        adapter_cache_invalidate(tenant_id=tenant.pk)
    return row


def user_with_adapter() -> tuple:
    """A new user, a key of theirs and its secret, and an active adapter version of the user's tenant: (user,
    key, secret, version)."""
    user = make_user()
    key, secret = make_key(user)
    return user, key, secret, activate_adapter(user.tenant)


@pytest.fixture
def secret() -> str:
    """The secret of a new user's key whose tenant has an active adapter."""
    return user_with_adapter()[2]


# The tiny model and its two random LoRA adapters (seeds 1 and 2), shared with tests/model; imported, not
# rewritten, so both folders build their adapters the same way.
from tests.model.conftest import lora_adapters, tiny_model_dir  # noqa: E402, F401

TENANT_ADAPTER = re.compile(r"^t\d+-v\d+$")


def forget_tenant_adapters(base_url: str) -> None:
    """Unloads tenant adapters (t<tenant>-v<version>) from a real vLLM.

    A server reused across test sessions (CLAWHUB_VLLM_URL) would still hold names from a previous session's
    tenants, whose primary keys a fresh test database hands out again: the gateway would take them for the
    new tenants' weights."""
    models = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"]
    for model in models:
        if model.get("parent") and TENANT_ADAPTER.match(model["id"]):
            httpx.post(f"{base_url}/v1/unload_lora_adapter", json={"lora_name": model["id"]}, timeout=60)
