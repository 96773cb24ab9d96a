"""Health checks: a slow check on a busy upstream does not take it out of rotation; a refusal does."""

import asyncio

import httpx

from clawhub.gateway.upstreams import HEALTH_MISSES, Upstream, UpstreamPool

URL = "http://upstream.test"


def _watched() -> tuple[dict, UpstreamPool, Upstream]:
    """A pool of one upstream whose answers follow ``behaviour["mode"]`` ("ok" to start, "slow", "refused"):
    (behaviour, pool, upstream)."""
    behaviour = {"mode": "ok"}

    def handler(request: httpx.Request) -> httpx.Response:
        if behaviour["mode"] == "slow":
            raise httpx.ReadTimeout("slow", request=request)
        if behaviour["mode"] == "refused":
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": []})
        return httpx.Response(200)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    pool = UpstreamPool([{"url": URL, "base_model": "tiny"}], client, health_interval=5.0)
    return behaviour, pool, pool.upstreams[0]


def test_slow_checks_take_an_upstream_out_only_after_several_in_a_row():
    behaviour, pool, up = _watched()

    async def scenario():
        assert await pool.check(up)
        behaviour["mode"] = "slow"
        for _ in range(HEALTH_MISSES - 1):
            await pool.check(up)
            assert up.healthy and pool.candidates(None) == [up]
        behaviour["mode"] = "ok"
        assert await pool.check(up) and up.misses == 0
        behaviour["mode"] = "slow"
        for _ in range(HEALTH_MISSES):
            await pool.check(up)
        assert not up.healthy and pool.candidates(None) == []

    asyncio.run(scenario())


def test_a_refused_connection_takes_it_out_at_once():
    behaviour, pool, up = _watched()

    async def scenario():
        assert await pool.check(up)
        behaviour["mode"] = "refused"
        await pool.check(up)
        assert not up.healthy
        behaviour["mode"] = "ok"
        assert await pool.check(up) and up.healthy

    asyncio.run(scenario())
