"""Contract tests: the real fireworks-ai training SDK, driven by FireworksBackend, against the local fake."""

from __future__ import annotations

import json
import time

import pytest

from tests.remote.conftest import FIREWORKS_ACCOUNT, chat_sample, opd_samples, small_config
from tests.remote.wire import assert_datum, expected_wire, opd_teacher
from workers.trainer.batching import encode_sample, prompt_ids, with_hint
from workers.trainer.remote import RemoteAuthError, RemoteTrainingError
from workers.trainer.remote.errors import RetryPolicy


def test_rl_batch_on_the_wire(fake_fireworks, make_fireworks, tokenizer, reference, tmp_path):
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


def test_opd_teacher_from_the_session_base_model_and_hint_by_overlap(
    fake_fireworks, make_fireworks, tokenizer, reference, tmp_path
):
    samples = opd_samples(tokenizer)
    backend = make_fireworks()
    backend.start(
        str(tokenizer.name_or_path), None, small_config(method="opd", w_opd=0.5), str(tmp_path / "r")
    )
    result = backend.train(samples)

    assert [d.sample_id for d in result.dropped] == [12]
    session = backend.service.training_session_id
    base_model = f"accounts/{FIREWORKS_ACCOUNT}/trainingSessions/{session}"
    teacher_prompts = [r["prompt"] for r in fake_fireworks.completion_requests if r["model"] == base_model]
    # Every scoring request used Fireworks' shape: token ids, echo, logprobs, raw_output, one token.
    assert fake_fireworks.completion_requests and all(
        r["echo"] and r["logprobs"] and r["raw_output"] and r["max_tokens"] == 1
        for r in fake_fireworks.completion_requests
    )
    [call] = fake_fireworks.forward_backward_batches
    for datum, sample in zip(call.data, samples[:2], strict=True):
        context, teacher = opd_teacher(tokenizer, reference, sample)
        assert context in teacher_prompts  # the teacher prefill: base weights, hint in the prompt
        # The OPD log-ratio clipped to +-1 (opd_clip), then weighted.
        advantages = [
            0.5 * max(-1.0, min(1.0, t - o)) for t, o in zip(teacher, sample.response_logprobs, strict=True)
        ]
        assert_datum(datum, expected_wire(tokenizer, sample, advantages, sample.response_logprobs, 2))
    # Choosing between two hints asked the policy snapshot (not the base) and the teacher for their top-4.
    topk = [r for r in fake_fireworks.completion_requests if r["top_logprobs"] == 4]
    assert {r["model"] == base_model for r in topk} == {True, False}
    assert any("/checkpoints/clawhub-policy-" in r["model"] for r in topk)


def test_combine_mixes_score_and_hint(fake_fireworks, make_fireworks, tokenizer, reference, tmp_path):
    samples = [
        chat_sample(tokenizer, 20, "Q1", "Score only.", reward=-1),
        chat_sample(tokenizer, 21, "Q2", "Hint only.", hints=["Be brief."]),
        chat_sample(tokenizer, 22, "Q3", "Both.", reward=1, hints=["Be kind."], recorded=False),
        chat_sample(tokenizer, 23, "Q4", "Neither."),
    ]
    backend = make_fireworks()
    backend.start(
        str(tokenizer.name_or_path),
        None,
        small_config(method="combine", w_rl=2.0, w_opd=1.0),
        str(tmp_path / "r"),
    )
    result = backend.train(samples)

    assert [d.sample_id for d in result.dropped] == [23]
    [call] = fake_fireworks.forward_backward_batches
    assert call.loss_fn == "ppo" and len(call.data) == 3
    for datum, sample in zip(call.data, samples[:3], strict=True):
        enc = encode_sample(tokenizer, sample, max_seq_len=512)
        n = len(enc.response_ids)
        full = enc.prompt_ids + enc.response_ids
        # Sample 22 came without recorded log-probs: pi_old is a prefill of the policy snapshot.
        old = sample.response_logprobs or reference.token_logprobs(full)[-n:]
        opd = [0.0] * n
        if sample.hints:
            ctx = prompt_ids(tokenizer, with_hint(sample.messages, sample.hints[0]), None) + enc.response_ids
            teacher = reference.token_logprobs(ctx)[-n:]
            opd = [max(-1.0, min(1.0, t - o)) for t, o in zip(teacher, old, strict=True)]
        advantages = [a + 2.0 * sample.reward for a in opd]
        assert_datum(datum, expected_wire(tokenizer, sample, advantages, old, 3))
    assert any(
        "/checkpoints/clawhub-policy-" in r["model"] and r["top_logprobs"] == 0
        for r in fake_fireworks.completion_requests
    )


def test_export_promotes_downloads_and_loads_with_peft(
    fake_fireworks, make_fireworks, tokenizer, tiny_model_dir, tmp_path
):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = make_fireworks()
    backend.start(str(tiny_model_dir), None, small_config(method="rl"), str(tmp_path / "r"))
    backend.train([chat_sample(tokenizer, 1, "Hi", "Hello there.", reward=1)])
    out = backend.export_adapter(str(tmp_path / "adapter"))

    [(model_id, promoted)] = fake_fireworks.promoted.items()
    assert promoted["base_model"] == "accounts/fireworks/models/tiny-qwen2"
    ids = backend.remote_ids()
    assert ids["model"] == f"accounts/{FIREWORKS_ACCOUNT}/models/{model_id}"
    assert ids["training_session"].startswith("ts-")
    assert json.loads((tmp_path / "adapter" / "remote.json").read_text())["backend"] == "fireworks"
    tokens = torch.tensor([tokenizer.encode("Hello there, how are you?")])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
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
