"""The default base model (SmolLM2-135M-Instruct) as ./dev run serves it: it answers a plain question, and one
LoRA update trained on the CPU by the project's trainer loads into the running vLLM and changes its greedy
answer.

Shares one vLLM for the real model (``real_vllm_server``); the folder comes from the model cache (prepared
once per machine, about a minute, before the server starts).
"""

import time
import uuid

import httpx
import pytest

from workers import base_models
from workers.trainer.backend import TrainConfig, TrainSample

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# What the update rewards: an answer the base model does not give.
TARGET = "Bonjour! Paris, mon ami. Paris is the capital of France, and I answer every question in French."


def greedy(server, model: str, messages=QUESTION, max_tokens: int = 24) -> str:
    response = httpx.post(f"{server.openai_url}/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_the_base_answers_and_one_cpu_update_loaded_at_runtime_changes_its_answer(real_vllm_server, tmp_path):
    """Over a minute, and vLLM's start in the fixture about two more: the base answers, the trainer loads the
    base and takes one optimizer step on four short samples (16 s with the suite's one torch thread on a
    loaded machine, 58 s with two), exports the adapter, vLLM loads it at run time and answers again. One
    test, so the base is asked once."""
    from workers.trainer.local import LocalBackend

    spec = base_models.describe(real_vllm_server.model_dir)
    assert spec is base_models.SMOLLM2
    models = httpx.get(f"{real_vllm_server.openai_url}/models", timeout=30).json()["data"]
    assert models[0]["max_model_len"] == spec.max_model_len == 16384
    base_answer = greedy(real_vllm_server, real_vllm_server.model)
    assert "Paris" in base_answer

    samples = [TrainSample(sample_id=i, messages=QUESTION, response_text=TARGET, reward=1) for i in range(4)]
    # One step of Binary RL towards the rewarded answer, at a learning rate high enough for one step to show.
    config = TrainConfig(method="rl", device="cpu", lr=5e-3, micro_batch_tokens=0, micro_batch_size=4)
    backend = LocalBackend()
    started = time.monotonic()
    try:
        backend.start(str(real_vllm_server.model_dir), None, config, str(tmp_path / "work"))
        result = backend.train(samples)
        adapter = backend.export_adapter(str(tmp_path / "adapter"))
    finally:
        backend.close()
    trained_s = time.monotonic() - started
    assert result.steps == 1 and not result.dropped

    name = f"real-{uuid.uuid4().hex[:8]}"
    loaded = httpx.post(f"{real_vllm_server.openai_url}/load_lora_adapter",
                        json={"lora_name": name, "lora_path": adapter}, timeout=120)
    assert loaded.status_code == 200, loaded.text
    try:
        adapted_answer = greedy(real_vllm_server, name)
    finally:
        httpx.post(f"{real_vllm_server.openai_url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    print(f"\ntrained in {trained_s:.0f} s; base: {base_answer!r}; adapter: {adapted_answer!r}")
    assert adapted_answer != base_answer
