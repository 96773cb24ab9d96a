"""The upstream pool: load-on-demand single flight (within and across gateways), no unload to make room,
failover, registry."""

import asyncio

import httpx

from clawhub.adapters.models import LoadedAdapter, Upstream
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter, start_fake, wait_until
from tests.ports import free_port

MSGS = [{"role": "user", "content": "hi"}]


def tenant_with_key():
    user = make_user()
    _, secret = make_key(user)
    version = activate_adapter(user.tenant)
    return secret, version


def ask(gateway, secret, model="clawhub-personal") -> httpx.Response:
    return httpx.post(f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": model, "messages": MSGS}, timeout=30)


def test_twenty_concurrent_first_requests_load_the_adapter_once(gateway, fake):
    secret, version = tenant_with_key()

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(
                client.post(f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                            json={"model": "clawhub-personal", "messages": MSGS}) for _ in range(20)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 20
    assert fake.stats()["load_calls"] == {version.upstream_name: 1}
    assert fake.stats()["requests"][version.upstream_name] == 20
    # The registry shows where the adapter lives, for promotion and draining.
    row = wait_until(lambda: LoadedAdapter.objects.filter(adapter_name=version.upstream_name).first())
    assert row.upstream.url == fake.url and row.adapter_version_id == version.pk
    assert Upstream.objects.get(url=fake.url).healthy


def test_the_gateway_never_unloads_to_make_room_vllm_evicts_on_its_own(gateway_factory, fake):
    # vLLM keeps --max-loras adapters on the GPU and --max-cpu-loras in memory, and reloads an evicted one
    # from its path by itself; an unload by the gateway would only pull the name from under other requests.
    gateway = gateway_factory([fake.url], max_adapters=2)
    tenants = [tenant_with_key() for _ in range(3)]
    for secret, _ in (*tenants, tenants[0]):
        assert ask(gateway, secret).status_code == 200
    stats = fake.stats()
    assert set(stats["adapters"]) == {v.upstream_name for _, v in tenants}
    assert stats["unload_calls"] == {}
    assert stats["load_calls"] == {v.upstream_name: 1 for _, v in tenants}


def test_a_second_gateway_finds_the_adapter_the_first_loaded_in_the_shared_view(gateway_factory, fake):
    first = gateway_factory([fake.url], health_interval=60)
    second = gateway_factory([fake.url], health_interval=60)  # its own view learned nothing since it started
    secret, version = tenant_with_key()
    assert ask(first, secret).status_code == 200
    assert ask(second, secret).status_code == 200
    assert fake.stats()["load_calls"] == {version.upstream_name: 1}


def test_concurrent_first_requests_on_two_gateways_load_once(gateway_factory, fake):
    gateways = [gateway_factory([fake.url], health_interval=60) for _ in range(2)]
    secret, version = tenant_with_key()

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(
                client.post(f"{gateways[i % 2].v1}/chat/completions",
                            headers={"Authorization": f"Bearer {secret}"},
                            json={"model": "clawhub-personal", "messages": MSGS}) for i in range(10)))

    assert [r.status_code for r in asyncio.run(burst())] == [200] * 10
    assert fake.stats()["load_calls"] == {version.upstream_name: 1}


def test_an_adapter_the_upstream_lost_is_loaded_again(gateway, fake):
    secret, version = tenant_with_key()
    assert ask(gateway, secret).status_code == 200
    httpx.post(f"{fake.url}/v1/unload_lora_adapter", json={"lora_name": version.upstream_name})
    response = ask(gateway, secret)
    assert response.status_code == 200, response.text
    assert fake.stats()["load_calls"] == {version.upstream_name: 2}


def test_failover_to_a_second_upstream_when_the_first_is_down(gateway_factory, fake):
    first = start_fake()
    try:
        gateway = gateway_factory([first.url, fake.url], health_interval=60)
        # A tenant kept on the first upstream by affinity (rendezvous hashing: about every second tenant).
        while True:
            secret, version = tenant_with_key()
            if gateway.app.pool.candidates(None, version.tenant_id)[0].url == first.url:
                break
        assert ask(gateway, secret, "base").json()["choices"][0]["message"]["content"].startswith("tiny")
        assert first.stats()["requests"] == {"tiny": 1}  # both idle: the tenant's own upstream answered
    finally:
        first.stop()
    response = ask(gateway, secret)
    assert response.status_code == 200, response.text
    assert fake.stats()["load_calls"] == {version.upstream_name: 1}
    record = gateway.spy.wait_for(2)[-1]
    assert record.upstream == fake.url
    assert [up.healthy for up in gateway.app.pool.upstreams] == [False, True]
    assert ask(gateway, secret, "base").status_code == 200


def test_no_healthy_upstream_is_503(gateway_factory):
    gateway = gateway_factory([f"http://127.0.0.1:{free_port()}"])
    secret, _ = tenant_with_key()
    response = ask(gateway, secret)
    assert response.status_code == 503 and response.json()["error"]["code"] == "service_unavailable"
    assert "retry-after" in response.headers


def test_a_burst_of_loads_queues_one_registry_write_with_the_newest_state(monkeypatch):
    """Before: each load queued a full sync of the upstream's registry rows (an UPDATE per loaded adapter):
    200 tenants' first requests after a restart made 20,000 statements on the gateway's writer thread."""
    from clawhub.adapters import registry
    from clawhub.gateway.upstreams import Loaded, UpstreamPool

    class Writer:
        def __init__(self):
            self.ops = []

        def submit_op(self, op) -> bool:
            self.ops.append(op)
            return True

    writer = Writer()
    pool = UpstreamPool([{"url": "http://upstream", "base_model": "tiny"}], client=None, health_interval=60,
                        writer=writer)
    up = pool.upstreams[0]
    for i in range(50):
        up.adapters[f"t{i}-v1"] = Loaded(version_id=i)
        pool._write_registry(up)
    written = []
    monkeypatch.setattr(registry, "loaded_adapter_sync", lambda **kw: written.append(kw["adapter_names"]))
    assert len(writer.ops) == 1
    writer.ops.pop()()
    assert written == [[f"t{i}-v1" for i in range(50)]]
    pool._write_registry(up)  # the next change queues again
    assert len(writer.ops) == 1
