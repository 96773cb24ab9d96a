"""Contract tests: the real fireworks-ai training SDK, driven by FireworksBackend, against the local fake."""

from __future__ import annotations

import json
import time

import pytest

from tests.remote.conftest import FIREWORKS_ACCOUNT, chat_sample, small_config
from tests.remote.test_tinker import assert_datum, expected_wire
from workers.trainer.batching import encode_sample
from workers.trainer.remote import RemoteAuthError, RemoteTrainingError
from workers.trainer.remote.protocol import RetryPolicy


def test_rl_batch_on_the_wire(fake_fireworks, make_fireworks, tokenizer, reference, tmp_path):
    # Binary RL only: OPD/Combine teacher log-probs go through Fireworks' inference API
    # (/inference/v1/completions with echo), which this fake does not speak yet.
    samples = [
        chat_sample(tokenizer, 1, "Q1", "Good answer.", reward=1),
        chat_sample(tokenizer, 2, "Q2", "Bad answer.", reward=-1),
        chat_sample(tokenizer, 3, "Q3", "No signal."),
    ]
    backend = make_fireworks()
    backend.start(str(tokenizer.name_or_path), None, small_config(method="rl", lr=2e-5), str(tmp_path / "r"))
    result = backend.train(samples)

    assert result.steps == 1 and [d.sample_id for d in result.dropped] == [3]
    [call] = fake_fireworks.forward_backward_batches
    assert call.loss_fn == "ppo" and call.loss_fn_config == pytest.approx(
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    )
    assert all(
        r.header("content-type").startswith("application/json")
        for r in fake_fireworks.calls("/api/v1/forward_backward")
    )  # Fireworks' JSON dialect
    for datum, sample in zip(call.data, samples[:2], strict=True):
        n = len(encode_sample(tokenizer, sample, max_seq_len=512).response_ids)
        want = expected_wire(tokenizer, sample, [float(sample.reward)] * n, sample.response_logprobs, 2)
        assert_datum(datum, want)
    assert fake_fireworks.optim_steps[0]["learning_rate"] == pytest.approx(2e-5)
    assert all(r.header("x-api-key") for r in fake_fireworks.calls("/api/v1/optim_step"))


def test_export_promotes_downloads_and_loads_with_peft(
    fake_fireworks, make_fireworks, tokenizer, tiny_dir, tmp_path
):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = make_fireworks()
    backend.start(str(tiny_dir), None, small_config(method="rl"), str(tmp_path / "r"))
    backend.train([chat_sample(tokenizer, 1, "Hi", "Hello there.", reward=1)])
    out = backend.export_adapter(str(tmp_path / "adapter"))

    [(model_id, promoted)] = fake_fireworks.promoted.items()
    assert promoted["base_model"] == "accounts/fireworks/models/tiny-qwen2"
    ids = backend.remote_ids()
    assert ids["model"] == f"accounts/{FIREWORKS_ACCOUNT}/models/{model_id}"
    assert ids["training_session"].startswith("ts-")
    assert json.loads((tmp_path / "adapter" / "remote.json").read_text())["backend"] == "fireworks"
    tokens = torch.tensor([tokenizer.encode("Hello there, how are you?")])
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        before = base(input_ids=tokens).logits
        after = PeftModel.from_pretrained(base, out).eval()(input_ids=tokens).logits
    assert (after - before).abs().max() > 1e-3


def test_bad_credentials_fail_at_once(fake_fireworks, make_fireworks, tokenizer, tmp_path):
    backend = make_fireworks(api_key="fw-wrong")
    started = time.monotonic()
    with pytest.raises(RemoteAuthError, match="fireworks refused the credentials"):
        backend.start(str(tokenizer.name_or_path), None, small_config(), str(tmp_path / "r"))
        backend.train([chat_sample(tokenizer, 1, "Hi", "Hello.", reward=1)])
    assert time.monotonic() - started < 15


def test_a_500_then_success_completes_the_run(fake_fireworks, make_fireworks, tokenizer, tmp_path):
    backend = make_fireworks()
    backend.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "r"))
    fake_fireworks.faults.fail_next("/api/v1/forward_backward", status=500, times=1)
    result = backend.train([chat_sample(tokenizer, 1, "Hi", "Hello.", reward=1)])
    assert result.steps == 1 and len(fake_fireworks.optim_steps) == 1
    assert ("status", "/api/v1/forward_backward") in fake_fireworks.faults.injected


def test_timeout_beyond_the_retry_budget(fake_fireworks, make_fireworks, tokenizer, tmp_path):
    backend = make_fireworks(
        retry=RetryPolicy(attempts=2, backoff_s=0.1, max_backoff_s=0.1, call_timeout_s=1.5)
    )
    backend.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "r"))
    fake_fireworks.faults.hang("/api/v1/optim_step", seconds=60)
    with pytest.raises(RemoteTrainingError, match="did not succeed after 2 attempts") as info:
        backend.train([chat_sample(tokenizer, 1, "Hi", "Hello.", reward=1)])
    assert info.value.transient
