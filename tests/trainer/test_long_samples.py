"""OpenClaw-sized samples train on CPU with the tiny model: a 13k-token served prompt is left-truncated to
max_seq_len (recorded), not dropped."""

import pytest

from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.batching import prompt_ids
from workers.trainer.local import LocalBackend

pytestmark = pytest.mark.slow


def test_a_13k_token_prompt_trains_left_truncated(tiny_model_dir, tokenizer, tmp_path):
    system = (
        "You are OpenClaw, a coding agent. Tools: read, write, exec, apply_patch. Follow AGENTS.md. " * 700
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "list the repo"}]
    served = prompt_ids(tokenizer, messages, None)
    assert len(served) > 13_000
    response = tokenizer.encode("README.md and src/.", add_special_tokens=False) + [tokenizer.eos_token_id]
    sample = TrainSample(
        sample_id="openclaw-1",
        messages=messages,
        response_text="README.md and src/.",
        prompt_token_ids=served,
        response_token_ids=response,
        response_logprobs=[-1.0] * len(response),
        reward=1,
        source="served ids",
    )
    backend = LocalBackend()
    backend.start(
        str(tiny_model_dir),
        None,
        TrainConfig(method="rl", dtype="float32", device="cpu", max_seq_len=2048),
        str(tmp_path / "work"),
    )
    try:
        result = backend.train([sample])
        entry = backend.prepared["openclaw-1"]
    finally:
        backend.close()
    assert result.dropped == [] and result.trained_sample_ids == ["openclaw-1"] and result.steps == 1
    assert len(entry["prompt_ids"]) + len(entry["response_ids"]) == 2048
    assert entry["prompt_ids"] == served[-(2048 - len(response)) :]  # the newest context
    assert f"prompt left-truncated by {len(served) - (2048 - len(response))} tokens" in entry["alignment"]
