"""Contract tests: the real `tinker` SDK, driven by TinkerBackend, against the local fake Tinker service.

What the SDK put on the wire (tokens, per-token pi_old and advantages, loss name and clip, learning rate) is
compared with what the batch should contain, computed here independently from workers.trainer.batching and
the tiny model's own log-probs.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.remote.conftest import chat_sample, opd_samples, small_config
from tests.remote.wire import assert_datum, expected_wire, opd_teacher
from workers.trainer.batching import encode_sample, prompt_ids, with_hint
from workers.trainer.remote import RemoteAuthError, RemoteTrainingError
from workers.trainer.remote.errors import RetryPolicy


def test_binary_rl_batch_on_the_wire(fake_tinker, make_tinker, tokenizer, reference, tmp_path):
    samples = [
        chat_sample(tokenizer, 1, "What is the capital of France?", "Paris is the capital.", reward=1),
        chat_sample(tokenizer, 2, "Say hello.", "Goodbye.", reward=-1, recorded=False),
        chat_sample(tokenizer, 3, "Anything?", "Maybe.", reward=0),  # no signal: never sent
    ]
    config = small_config(method="rl", lr=4e-5)
    backend = make_tinker()
    backend.start(str(tokenizer.name_or_path), None, config, str(tmp_path / "run"))
    result = backend.train(samples)

    assert result.steps == 1 and sorted(result.trained_sample_ids) == [1, 2]
    assert [d.sample_id for d in result.dropped] == [3]
    [call] = fake_tinker.forward_backward_batches
    assert call.loss_fn == "ppo"
    assert call.loss_fn_config == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    assert len(call.data) == 2
    # Sample 1: recorded sampling log-probs travel as pi_old; A = +1 on every response token.
    enc1 = encode_sample(tokenizer, samples[0], max_seq_len=512)
    assert_datum(
        call.data[0],
        expected_wire(tokenizer, samples[0], [1.0] * len(enc1.response_ids), samples[0].response_logprobs, 2),
    )
    # Sample 2 had no recorded log-probs: pi_old is the policy's prefill log-probs (the fake's tiny model).
    enc2 = encode_sample(tokenizer, samples[1], max_seq_len=512)
    full = enc2.prompt_ids + enc2.response_ids
    old2 = reference.token_logprobs(full)[-len(enc2.response_ids) :]
    assert_datum(call.data[1], expected_wire(tokenizer, samples[1], [-1.0] * len(enc2.response_ids), old2, 2))
    [optim] = fake_tinker.optim_steps
    assert optim["learning_rate"] == pytest.approx(4e-5)
    assert (optim["beta1"], optim["beta2"]) == pytest.approx((0.9, 0.98))
    assert result.metrics[0].loss == pytest.approx(call.loss, abs=1e-4) and call.loss != 0
    ids = backend.remote_ids()
    assert ids["backend"] == "tinker" and ids["training_run_id"] and ids["state_path"].startswith("tinker://")


def test_opd_uses_teacher_from_base_model_and_picks_hint_by_overlap(
    fake_tinker, make_tinker, tokenizer, reference, tmp_path
):
    samples = opd_samples(tokenizer)
    config = small_config(method="opd", w_opd=0.5)
    backend = make_tinker()
    backend.start(str(tokenizer.name_or_path), None, config, str(tmp_path / "run"))
    result = backend.train(samples)

    assert [d.sample_id for d in result.dropped] == [12]
    [call] = fake_tinker.forward_backward_batches
    for datum, sample in zip(call.data, samples[:2], strict=True):
        context, teacher = opd_teacher(tokenizer, reference, sample)
        assert context in fake_tinker.logprob_requests  # the teacher prefill the SDK asked for
        # The OPD log-ratio clipped to +-1 (opd_clip), then weighted.
        advantages = [
            0.5 * max(-1.0, min(1.0, t - o)) for t, o in zip(teacher, sample.response_logprobs, strict=True)
        ]
        assert_datum(datum, expected_wire(tokenizer, sample, advantages, sample.response_logprobs, 2))
    assert any(k == 4 for _, k in fake_tinker.topk_requests)  # overlap selection asked for top-4


def test_combine_mixes_score_and_hint(fake_tinker, make_tinker, tokenizer, reference, tmp_path):
    samples = [
        chat_sample(tokenizer, 20, "Q1", "Score only.", reward=-1),
        chat_sample(tokenizer, 21, "Q2", "Hint only.", hints=["Be brief."]),
        chat_sample(tokenizer, 22, "Q3", "Both.", reward=1, hints=["Be kind."]),
        chat_sample(tokenizer, 23, "Q4", "Neither."),
    ]
    config = small_config(method="combine", w_rl=2.0, w_opd=1.0)
    backend = make_tinker()
    backend.start(str(tokenizer.name_or_path), None, config, str(tmp_path / "run"))
    result = backend.train(samples)

    assert [d.sample_id for d in result.dropped] == [23]
    [call] = fake_tinker.forward_backward_batches
    assert len(call.data) == 3
    for datum, sample in zip(call.data, samples[:3], strict=True):
        enc = encode_sample(tokenizer, sample, max_seq_len=512)
        n = len(enc.response_ids)
        opd = [0.0] * n
        if sample.hints:
            ctx = prompt_ids(tokenizer, with_hint(sample.messages, sample.hints[0]), None) + enc.response_ids
            teacher = reference.token_logprobs(ctx)[-n:]
            opd = [max(-1.0, min(1.0, t - o)) for t, o in zip(teacher, sample.response_logprobs, strict=True)]
        advantages = [a + 2.0 * sample.reward for a in opd]
        assert_datum(datum, expected_wire(tokenizer, sample, advantages, sample.response_logprobs, 3))


def test_steps_state_and_resume(fake_tinker, make_tinker, tokenizer, tmp_path):
    samples = [chat_sample(tokenizer, i, f"Q{i}", f"Answer {i}.", reward=1) for i in range(4)]
    config = small_config(method="rl", micro_batch_size=1, grad_accum=2)  # 2 samples per step -> 2 steps
    workdir = str(tmp_path / "run")
    first = make_tinker()
    first.start(str(tokenizer.name_or_path), None, config, workdir)
    seen = []
    result = first.train(samples, on_step=seen.append)
    assert result.steps == 2 and [m.step for m in seen] == [1, 2]
    assert len(fake_tinker.forward_backward_batches) == 4  # one per micro-batch
    assert len(fake_tinker.optim_steps) == 2
    # A save_state after every step (and one at step 0), so a redelivered task resumes.
    assert len(fake_tinker.calls("/api/v1/save_weights")) == 3
    state = json.loads((tmp_path / "run" / "remote_state.json").read_text())
    assert state["step"] == 2 and state["state_path"].startswith("tinker://")
    first.close()

    again = make_tinker()
    again.start(str(tokenizer.name_or_path), None, config, workdir)
    result = again.train(samples)
    assert result.resumed_from_step == 2 and result.steps == 2
    assert len(fake_tinker.optim_steps) == 2  # nothing repeated
    assert fake_tinker.loads[-1] == {
        "path": state["state_path"],
        "model_id": fake_tinker.loads[-1]["model_id"],
        "optimizer": True,
    }  # restored weights AND optimizer from the saved state


def test_export_is_a_peft_adapter_that_changes_the_model(
    fake_tinker, make_tinker, tokenizer, tiny_model_dir, tmp_path
):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = make_tinker()
    backend.start(str(tiny_model_dir), None, small_config(method="rl"), str(tmp_path / "run"))
    backend.train([chat_sample(tokenizer, 1, "Hi", "Hello there.", reward=1)])
    out = tmp_path / "adapter"
    assert backend.export_adapter(str(out)) == str(out)

    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    remote = json.loads((out / "remote.json").read_text())
    assert remote["backend"] == "tinker" and remote["weights_path"].startswith("tinker://")
    assert fake_tinker.calls("/external_weights_urls")

    ids = torch.tensor([tokenizer.encode("Hello there, how are you?")])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        before = base(input_ids=ids).logits
        tuned = PeftModel.from_pretrained(base, out).eval()
        after = tuned(input_ids=ids).logits
    assert (after - before).abs().max() > 1e-3


def test_close_finishes_the_remote_session_with_the_runs_outcome(
    fake_tinker, make_tinker, tokenizer, tmp_path
):
    exported = make_tinker()
    exported.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "a"))
    exported.train([chat_sample(tokenizer, 1, "Hi", "Hello there.", reward=1)])
    exported.export_adapter(str(tmp_path / "adapter"))
    exported.close()
    failed = make_tinker()
    failed.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "b"))
    failed.close()  # a run that never exported its adapter
    reasons = [session.get("reason") for session in fake_tinker.sessions.values()]
    # Unfinished sessions keep the SDK's heartbeat thread running for the life of the worker process.
    assert all(session["finished"] for session in fake_tinker.sessions.values())
    assert sorted(reasons) == ["errored", "success"]


def test_parent_adapter_trained_on_tinker_continues_from_its_state(
    fake_tinker, make_tinker, tokenizer, tmp_path
):
    first = make_tinker()
    first.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "v1"))
    first.train([chat_sample(tokenizer, 1, "Hi", "Hello.", reward=1)])
    parent = first.export_adapter(str(tmp_path / "adapter-v1"))
    state_path = first.remote_ids()["state_path"]

    child = make_tinker()
    child.start(str(tokenizer.name_or_path), parent, small_config(method="rl"), str(tmp_path / "v2"))
    # Optimizer continuity on Tinker: the next version's run restores the parent's weights AND its Adam state
    # (save_state / create_training_client_from_state_with_optimizer), so it continues that optimisation.
    assert fake_tinker.loads[-1]["path"] == state_path and fake_tinker.loads[-1]["optimizer"] is True
    child.train([chat_sample(tokenizer, 2, "Hi again", "Hello again.", reward=1)])
    assert [o["step"] for o in fake_tinker.optim_steps][-1] == 2  # the remote run's second Adam step


# ---------------------------------------------------------------------------------------------- faults


def test_bad_credentials_fail_at_once(fake_tinker, make_tinker, tokenizer, tmp_path):
    backend = make_tinker(api_key="tml-wrong")
    started = time.monotonic()
    with pytest.raises(RemoteAuthError, match="refused the credentials"):
        backend.start(str(tokenizer.name_or_path), None, small_config(), str(tmp_path / "run"))
    assert time.monotonic() - started < 15
    assert "tml-wrong" not in repr(backend)


def test_a_500_then_success_completes_the_run(fake_tinker, make_tinker, tokenizer, tmp_path):
    backend = make_tinker()
    backend.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "run"))
    fake_tinker.faults.fail_next("/api/v1/forward_backward", status=500, times=1)
    fake_tinker.faults.fail_next("/api/v1/optim_step", status=503, times=1)
    result = backend.train([chat_sample(tokenizer, 1, "Hi", "Hello.", reward=1)])
    assert result.steps == 1
    assert ("status", "/api/v1/forward_backward") in fake_tinker.faults.injected
    assert len(fake_tinker.optim_steps) == 1  # retried, not applied twice


def test_timeout_beyond_the_retry_budget_fails_with_a_clear_message(
    fake_tinker, make_tinker, tokenizer, tmp_path
):
    retry = RetryPolicy(attempts=2, backoff_s=0.1, max_backoff_s=0.1, call_timeout_s=1.5)
    backend = make_tinker(retry=retry)
    backend.start(str(tokenizer.name_or_path), None, small_config(method="rl"), str(tmp_path / "run"))
    fake_tinker.faults.hang("/api/v1/forward_backward", seconds=60)
    started = time.monotonic()
    with pytest.raises(RemoteTrainingError, match=r"step 1 did not succeed after 2 attempts") as info:
        backend.train([chat_sample(tokenizer, 1, "Hi", "Hello.", reward=1)])
    assert info.value.transient and not isinstance(info.value, RemoteAuthError)
    assert time.monotonic() - started < 30
    assert fake_tinker.optim_steps == []
