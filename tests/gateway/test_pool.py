"""The upstream pool: load-on-demand single flight, LRU unload at capacity, failover, registry."""

import asyncio

import httpx

from clawhub.gateway.models import LoadedAdapter, Upstream
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter, free_port, start_fake, wait_until

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


def test_least_recently_used_adapter_is_unloaded_at_capacity(gateway_factory, fake):
    gateway = gateway_factory([fake.url], max_adapters=2)
    (a, va), (b, vb), (c, vc) = tenant_with_key(), tenant_with_key(), tenant_with_key()
    for secret in (a, b, a, c):  # b is now the least recently used
        assert ask(gateway, secret).status_code == 200
    stats = fake.stats()
    assert set(stats["adapters"]) == {va.upstream_name, vc.upstream_name}
    assert stats["unload_calls"] == {vb.upstream_name: 1}
    assert ask(gateway, b).status_code == 200  # evicts a, the least recently used now
    stats = fake.stats()
    assert set(stats["adapters"]) == {vb.upstream_name, vc.upstream_name}
    assert stats["load_calls"][vb.upstream_name] == 2


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
        secret, version = tenant_with_key()
        assert ask(gateway, secret, "base").json()["choices"][0]["message"]["content"].startswith("tiny")
        assert first.stats()["requests"] == {"tiny": 1}  # both idle: the first in the list answered
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
