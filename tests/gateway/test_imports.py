"""The web/gateway process never imports the ML stack, even after serving /v1."""

import subprocess
import sys

SCRIPT = """
import asyncio, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "clawhub.settings.test"
os.environ["CLAWHUB_UPSTREAMS"] = '[{"url": "http://127.0.0.1:9", "base_model": "tiny"}]'
import httpx
import clawhub.asgi
import clawhub.conversations.capture.store  # what the consumer imports on its first batch

async def main():
    transport = httpx.ASGITransport(app=clawhub.asgi.application)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.post("/v1/chat/completions", json={"model": "base", "messages": []})
        assert r.status_code == 401, r.text
        r = await client.get("/v1/models", headers={"Authorization": "Bearer chk_nope"})
        assert r.status_code in (401, 503), r.text  # 503: no database to check the key against
    await clawhub.asgi.gateway.shutdown()

asyncio.run(main())
heavy = sorted(m for m in ("torch", "transformers", "peft", "vllm") if m in sys.modules)
print("HEAVY:", ",".join(heavy))
"""


def test_serving_v1_never_imports_torch_transformers_or_peft():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "HEAVY: \n" in result.stdout or result.stdout.strip().endswith("HEAVY:"), result.stdout


SETUP_SCRIPT = """
import os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "clawhub.settings.test"
import django
django.setup()  # every app's models, settings validated: the judge and backend names are read here
loaded = sorted(m for m in ("workers.judge.judges", "workers.trainer.local", "workers.trainer.remote.tinker",
                            "workers.trainer.remote.fireworks", "torch") if m in sys.modules)
print("LOADED:", ",".join(loaded))
"""


def test_setting_up_django_imports_no_judge_and_no_training_backend():
    # The registries name their classes without importing them (workers/judge/registry.py,
    # workers/trainer/registry.py): the judge module and the backends load where they are used.
    result = subprocess.run([sys.executable, "-c", SETUP_SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("LOADED:"), result.stdout
