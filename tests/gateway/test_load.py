"""No lost turns under a bounded concurrent load, and usage that adds up."""

import asyncio
import random

import httpx
import orjson

from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter

REQUESTS, CLIENTS = 200, 32


def test_200_streams_from_32_clients_record_200_turns_and_exact_usage(gateway, fake):
    secrets = []
    for i in range(4):
        user = make_user()
        _, secret = make_key(user)
        if i % 2:
            activate_adapter(user.tenant)
        secrets.append(secret)
    rng = random.Random(7)
    jobs = [(secrets[i % 4], rng.randint(1, 24)) for i in range(REQUESTS)]
    usages: list[dict] = []

    async def one(client: httpx.AsyncClient, secret: str, max_tokens: int) -> None:
        body = {"model": "clawhub-personal", "stream": True, "max_tokens": max_tokens,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "count " * rng.randint(1, 9)}]}
        async with client.stream("POST", f"{gateway.v1}/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {secret}"}) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        usages.append(orjson.loads(lines[-2][6:])["usage"])

    async def worker(queue: asyncio.Queue, client: httpx.AsyncClient) -> None:
        while not queue.empty():
            await one(client, *queue.get_nowait())

    async def run() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(worker(queue, client) for _ in range(CLIENTS)))

    asyncio.run(run())
    assert len(usages) == REQUESTS
    records = gateway.spy.wait_for(REQUESTS, timeout=30)
    assert len(records) == REQUESTS and len({r.request_id for r in records}) == REQUESTS
    assert all(r.status == "complete" and not r.usage_estimated for r in records)
    assert sum(r.prompt_tokens for r in records) == sum(u["prompt_tokens"] for u in usages)
    assert sum(r.completion_tokens for r in records) == sum(u["completion_tokens"] for u in usages)
    assert sum(len(r.token_ids) for r in records) == sum(u["completion_tokens"] for u in usages)
