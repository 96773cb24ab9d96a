"""LocalBackend on the tiny model: on-policy sampling, exact gradient accumulation, checkpoint/resume,
export."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.specs import LORA_TARGET_MODULES
from tests.trainer.conftest import sampled_batch
from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.batching import collate, encode_batch, pad_values
from workers.trainer.forward import response_logprobs
from workers.trainer.local import LocalBackend


def started(tiny_model_dir, workdir, parent=None, **config) -> LocalBackend:
    backend = LocalBackend()
    backend.start(
        str(tiny_model_dir), parent, TrainConfig(device="cpu", **{"lr": 1e-3, **config}), str(workdir)
    )
    return backend


def adapter_weights(backend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters() if p.requires_grad}


def test_sampled_logprobs_are_the_policys_own(tiny_model_dir, tmp_path, prompts):
    """generate() with top_k=0, top_p=1 and raw log-probs: the trainer recomputes them (rho = 1)."""
    backend = started(tiny_model_dir, tmp_path)
    batch = sampled_batch(backend, prompts[:8], seed=0)
    encoded, dropped = encode_batch(backend.tokenizer, batch, max_seq_len=2048)
    # Re-rendered from the messages (these samples carry no served ids), with the recorded log-probs kept.
    assert not dropped and all(e.alignment.endswith("; recorded") for e in encoded)
    sequences = collate([(e.prompt_ids, e.response_ids) for e in encoded], pad_id=0)
    with torch.no_grad():
        recomputed, _ = response_logprobs(backend.model, sequences)
    recorded = pad_values([e.old_logprobs for e in encoded], sequences.mask.shape[1])
    assert ((recomputed - recorded).abs() * sequences.mask).max() < 1e-4
    # Some samples stop on <|im_end|>, which is part of the trained response.
    assert any(s.response_token_ids[-1] == backend.tokenizer.eos_token_id for s in batch)


def test_gradient_accumulation_equals_one_big_batch(tiny_model_dir, tmp_path, prompts):
    probe = started(tiny_model_dir, tmp_path / "probe")
    batch = sampled_batch(probe, prompts[:8], seed=1)
    assert {s.reward for s in batch} == {-1, 1}
    one = started(tiny_model_dir, tmp_path / "one", method="combine", micro_batch_size=8)
    accumulated = started(
        tiny_model_dir,
        tmp_path / "acc",
        method="combine",
        micro_batch_size=2,
        grad_accum=4,
        padding_side="left",
    )
    r1, r2 = one.train(batch), accumulated.train(batch)
    assert r1.steps == r2.steps == 1
    assert r1.metrics[0].loss == pytest.approx(r2.metrics[0].loss, abs=1e-5)
    w1, w2 = adapter_weights(one), adapter_weights(accumulated)
    assert any((w != 0).any() for n, w in w1.items() if "lora_B" in n)  # the step did something
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-6), name


class Crash(Exception):
    pass


def test_a_killed_run_resumes_after_the_last_checkpoint_with_identical_state(
    tiny_model_dir, tmp_path, prompts
):
    probe = started(tiny_model_dir, tmp_path / "probe")
    batch = sampled_batch(probe, prompts[:12], seed=2)
    # Half of them without recorded ids/logprobs: their pi_old is computed before step 1 and must survive the
    # crash (recomputing it after two updates would change the remaining step).
    for sample in batch[::2]:
        sample.response_token_ids = sample.response_logprobs = None
    # 12 samples -> 3 optimizer steps, each checkpointed (the default cadence would write only the last).
    config = {"method": "rl", "micro_batch_size": 2, "grad_accum": 2, "checkpoint_seconds": 0}

    reference = started(tiny_model_dir, tmp_path / "reference", **config)
    uninterrupted = reference.train(batch)
    assert [m.step for m in uninterrupted.metrics] == [1, 2, 3]

    workdir = tmp_path / "run"
    first = started(tiny_model_dir, workdir, **config)
    seen = {}

    def crash_after_step_2(metrics):
        if metrics.step == 2:
            seen["optimizer"] = first.optimizer.state_dict()
            seen["weights"] = adapter_weights(first)
            raise Crash

    with pytest.raises(Crash):
        first.train(batch, on_step=crash_after_step_2)
    # A half-written checkpoint (the process died while saving step 3) must be ignored.
    (workdir / "checkpoints" / ".tmp-step-00000003-999").mkdir()

    with pytest.raises(ValueError, match=r"different TrainConfig \(lr\)"):
        started(tiny_model_dir, workdir, **{**config, "lr": 5e-4})
    second = started(tiny_model_dir, workdir, **config)
    assert second.resumed_from_step == 2
    restored = second.optimizer.state_dict()
    assert restored["param_groups"] == seen["optimizer"]["param_groups"]
    for key, state in seen["optimizer"]["state"].items():
        assert state["step"] == restored["state"][key]["step"] == 2
        assert torch.equal(state["exp_avg"], restored["state"][key]["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], restored["state"][key]["exp_avg_sq"])
    for name, weight in adapter_weights(second).items():
        assert torch.equal(weight, seen["weights"][name]), name

    steps = []
    resumed = second.train(batch, on_step=lambda m: steps.append(m.step))
    assert steps == [3] and resumed.resumed_from_step == 2 and resumed.steps == 3
    assert sorted(resumed.trained_sample_ids) == list(range(12))
    for name, weight in adapter_weights(second).items():
        assert torch.allclose(weight, adapter_weights(reference)[name], atol=1e-7), name
    assert not list((workdir / "checkpoints").glob(".tmp-*"))  # swept by the next save

    # Redelivered once more: nothing is trained twice.
    again = second.train(batch, on_step=lambda m: steps.append(m.step))
    assert steps == [3] and again.steps == 3 and [m.step for m in again.metrics] == [1, 2, 3]


def test_a_different_batch_cannot_hijack_an_unfinished_run(tiny_model_dir, tmp_path, prompts):
    probe = started(tiny_model_dir, tmp_path / "probe")
    batch = sampled_batch(probe, prompts[:4], seed=3)
    config = {"method": "rl", "micro_batch_size": 1, "grad_accum": 1, "checkpoint_seconds": 0}
    first = started(tiny_model_dir, tmp_path / "run", **config)

    def crash(metrics):
        raise Crash

    with pytest.raises(Crash):
        first.train(batch, on_step=crash)
    second = started(tiny_model_dir, tmp_path / "run", **config)
    other = [TrainSample(**{**vars(s), "sample_id": s.sample_id + 100}) for s in batch]
    with pytest.raises(RuntimeError, match="unfinished train\\(\\) on other samples"):
        second.train(other)


def test_a_short_run_writes_its_full_state_once_at_the_end(tiny_model_dir, tmp_path, prompts, monkeypatch):
    """The checkpoint cadence: nothing at start, a step's checkpoint only when checkpoint_seconds have
    passed since the last, and always the call's last step (so a one-step run writes once)."""
    from workers.trainer import local

    saved = []
    save = local.ckpt.save_checkpoint
    def counted(workdir, **kwargs):
        saved.append(kwargs["step"])
        return save(workdir, **kwargs)

    monkeypatch.setattr(local.ckpt, "save_checkpoint", counted)
    probe = started(tiny_model_dir, tmp_path / "probe", method="rl")
    batch = sampled_batch(probe, prompts[:4], seed=7)
    saved.clear()

    one = started(tiny_model_dir, tmp_path / "one", method="rl")
    assert saved == [] and local.ckpt.latest_checkpoint(tmp_path / "one") is None
    result = one.train(batch)
    assert result.steps == 1 and saved == [1]
    # The final state is what is on disk: the adapter as trained, the call finished.
    final = local.ckpt.latest_checkpoint(tmp_path / "one")
    state, _, _, _ = local.ckpt.load_checkpoint(final)
    assert state["step"] == 1 and state["current"]["done_steps"] == 1
    assert result.adapter_dir == str(final / "adapter")
    on_disk = load_file(f"{final}/adapter/adapter_model.safetensors")
    trained = local.ckpt.adapter_state(one.model, one.adapter)
    assert on_disk.keys() == trained.keys() and all(torch.equal(on_disk[k], v) for k, v in trained.items())

    saved.clear()
    three = started(tiny_model_dir, tmp_path / "three", method="rl", mini_batches=3)
    three.train(sampled_batch(probe, prompts[4:10], seed=8))
    assert saved == [3]  # a short run: its last step only
    saved.clear()
    every = started(tiny_model_dir, tmp_path / "every", method="rl", mini_batches=3, checkpoint_seconds=0)
    every.train(sampled_batch(probe, prompts[4:10], seed=8))
    assert saved == [1, 2, 3]
    # A call with nothing to train still leaves its state (and the adapter it reports).
    saved.clear()
    neutral = [TrainSample(**{**vars(s), "sample_id": f"n{i}", "reward": 0}) for i, s in enumerate(batch)]
    empty = started(tiny_model_dir, tmp_path / "empty", method="rl").train(neutral)
    assert saved == [0] and empty.steps == 0 and Path(empty.adapter_dir).is_dir()


def test_dropped_samples_are_reported_with_reasons(tiny_model_dir, tmp_path, prompts):
    backend = started(tiny_model_dir, tmp_path, method="rl", max_seq_len=128)
    good = sampled_batch(backend, prompts[:2], seed=4)
    neutral = TrainSample(sample_id="neutral", messages=prompts[2], response_text="Fine.", reward=0)
    long = TrainSample(sample_id="long", messages=prompts[3], response_text="word " * 300, reward=1)
    result = backend.train([*good, neutral, long])
    reasons = {d.sample_id: d.reason for d in result.dropped}
    assert reasons["neutral"] == "reward 0: no RL signal"
    assert reasons["long"].startswith("too long:")
    assert sorted(result.trained_sample_ids) == [0, 1]
    assert {d.sample_id for d in result.metrics[0].dropped} == {"neutral", "long"}


def test_kl_term_to_the_base(tiny_model_dir, tmp_path, prompts):
    backend = started(tiny_model_dir, tmp_path, method="rl", kl_coef=0.5, epochs=2, lr=1e-2)
    batch = sampled_batch(backend, prompts[:4], seed=5)
    result = backend.train(batch)
    # Step 1 starts at the base (LoRA B = 0), so KL = 0; after an update the policy has moved away from it.
    assert result.metrics[0].kl == pytest.approx(0.0, abs=1e-6)
    assert result.metrics[1].kl > 1e-6


def test_exported_adapter_loads_with_peft_and_changes_outputs(tiny_model_dir, tmp_path, prompts):
    backend = started(tiny_model_dir, tmp_path / "run", method="rl", lr=2e-2, epochs=3)
    batch = sampled_batch(backend, prompts[:8], seed=6)
    backend.train(batch)
    out = backend.export_adapter(str(tmp_path / "export" / "v1"))
    files = {p.name for p in (tmp_path / "export" / "v1").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    config = json.loads((tmp_path / "export" / "v1" / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32 and config["peft_type"] == "LORA"
    assert set(config["target_modules"]) == LORA_TARGET_MODULES
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    assert all(k.startswith("base_model.model.") for k in load_file(f"{out}/adapter_model.safetensors"))

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = backend.tokenizer.apply_chat_template(prompts[0], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
        base_greedy = base.generate(input_ids=ids, do_sample=False, max_new_tokens=20)
    loaded = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        tuned_logits = loaded(input_ids=ids).logits
        tuned_greedy = loaded.generate(input_ids=ids, do_sample=False, max_new_tokens=20)
        backend.model.eval()
        trainer_logits = backend.model(input_ids=ids).logits
    assert (tuned_logits - base_logits).abs().max() > 1e-2  # the adapter changes the outputs
    assert torch.allclose(tuned_logits, trainer_logits, atol=1e-5)  # and is exactly what was trained
    assert not torch.equal(tuned_greedy, base_greedy)


def test_continuing_a_parent_adapter_keeps_its_shape(tiny_model_dir, tmp_path, prompts):
    from workers.tiny_model.builder import make_lora_adapter

    parent = make_lora_adapter(tiny_model_dir, tmp_path / "parent", seed=1, rank=8, alpha=16)
    backend = started(tiny_model_dir, tmp_path / "run", parent=str(parent), method="rl")
    parent_weights = load_file(f"{parent}/adapter_model.safetensors")
    before = backend.export_adapter(str(tmp_path / "v0"))
    for name, weight in load_file(f"{before}/adapter_model.safetensors").items():
        assert torch.equal(weight, parent_weights[name])  # starts from the parent, not from zero
    backend.train(sampled_batch(backend, prompts[:4], seed=7))
    after = backend.export_adapter(str(tmp_path / "v1"))
    assert json.loads((tmp_path / "v1" / "adapter_config.json").read_text())["r"] == 8
    changed = load_file(f"{after}/adapter_model.safetensors")
    assert any(not torch.equal(changed[n], parent_weights[n]) for n in parent_weights)
    shutil.rmtree(tmp_path / "v0")


# ------------------------------------------------------------------------------------- the sampled policy


def served(backend, prompt, *, sample_id, shift=0.0, mode="processed_logprobs", **sampling):
    """A turn as the gateway records it: served prompt ids, sampled ids, and log-probs of the policy under
    its sampler (temperature / top_p / top_k) with `shift` nats added to each."""
    from workers.trainer.batching import prompt_ids

    reply = backend.sample([prompt], max_new_tokens=12, seed=sample_id)[0]
    probe = TrainSample(sample_id=sample_id, messages=prompt, response_text=reply.text, **sampling)
    ids = prompt_ids(backend.tokenizer, prompt, None)
    with torch.no_grad():
        logp, _ = backend._forward([(ids, reply.token_ids)], samplers=[probe.sampler])
    exact = logp[0, : len(reply.token_ids)]
    return TrainSample(
        **{**vars(probe), "prompt_token_ids": ids, "response_token_ids": reply.token_ids,
           "response_logprobs": (exact + shift).tolist(), "logprobs_mode": mode, "reward": 1,
           "source": "served ids"}
    )


def test_recorded_logprobs_are_pi_old_by_default(tiny_model_dir, tmp_path, prompts):
    """Recorded log-probs 0.3 nats below the policy's: rho = exp(0.3) = 1.35 on every token at step 1,
    above the clip range, so with A = +1 each token's loss is max(-1.35, -1.28) = -1.28, and every token
    counts as clipped. Recomputed from the policy (old_policy "start"), rho = 1 and the loss is -1."""
    recorded = started(tiny_model_dir, tmp_path / "recorded", method="rl")
    sample = served(recorded, prompts[0], sample_id=1, shift=-0.3)
    assert math.exp(0.3) > 1.28
    result = recorded.train([sample])
    assert result.metrics[0].loss == pytest.approx(-1.28, abs=1e-4)
    assert result.metrics[0].clip_fraction == 1.0
    assert result.sample_notes["1"]["pi_old"] == "recorded"

    start = started(tiny_model_dir, tmp_path / "start", method="rl", old_policy="start")
    result = start.train([sample])
    assert result.metrics[0].loss == pytest.approx(-1.0, abs=1e-4)
    assert result.metrics[0].clip_fraction == 0.0
    assert result.sample_notes["1"]["pi_old"] == "recomputed: old_policy 'start'"


def test_the_policy_is_scored_at_the_sampling_temperature(tiny_model_dir, tmp_path, prompts):
    """Processed log-probs at T = 0.5, top-k 5 are the trainer's own at step 1 (rho = 1, loss -1); the same
    numbers said to be raw log-probs (before temperature) are not used, and pi_old is recomputed."""
    backend = started(tiny_model_dir, tmp_path / "t", method="rl")
    sample = served(backend, prompts[1], sample_id=2, temperature=0.5, top_k=5)
    plain = served(backend, prompts[1], sample_id=2)
    assert sample.response_token_ids == plain.response_token_ids
    # At temperature 1 the same tokens have other log-probs: scoring at 1 would put rho away from 1.
    gaps = [abs(a - b) for a, b in zip(sample.response_logprobs, plain.response_logprobs, strict=True)]
    assert max(gaps) > 0.05
    result = backend.train([sample])
    assert result.metrics[0].loss == pytest.approx(-1.0, abs=1e-4)
    assert result.sample_notes["2"] == {"pi_old": "recorded", "version_lag": None, "sampler": [0.5, 1.0, 5]}

    raw = started(tiny_model_dir, tmp_path / "raw", method="rl")
    result = raw.train([TrainSample(**{**vars(sample), "logprobs_mode": "raw_logprobs"})])
    assert result.sample_notes["2"]["pi_old"].startswith("recomputed: raw log-probs (before temperature")


def test_samples_served_too_many_versions_back_are_not_trained(tiny_model_dir, tmp_path, prompts):
    backend = started(tiny_model_dir, tmp_path, method="rl", max_version_lag=1)
    fresh = TrainSample(**{**vars(served(backend, prompts[0], sample_id=3)), "version_lag": 1})
    stale = TrainSample(**{**vars(fresh), "sample_id": 4, "version_lag": 2})
    result = backend.train([fresh, stale])
    assert result.trained_sample_ids == [3]
    assert result.sample_notes["3"]["version_lag"] == 1
    assert {d.sample_id: d.reason for d in result.dropped} == {
        4: "served 2 adapter versions behind the one trained (max_version_lag 1)"
    }


def test_a_bf16_base_trains_a_bf16_adapter_with_float32_optimizer_state(tiny_model_dir, tmp_path, prompts):
    """The adapter follows the base's dtype (peft would make it float32); AdamW steps float32 masters with
    float32 moments, rounded into the adapter; the export is bf16 and its optimizer state carries on. The
    same in a multi-tenant pass (the grouped LoRA layer then runs in bf16)."""
    from workers.trainer import resident
    from workers.trainer.multitenant import MultiTenantPass, TenantJob

    probe = started(tiny_model_dir, tmp_path / "probe", method="rl")
    batch = sampled_batch(probe, prompts[:4], seed=9)
    run = started(tiny_model_dir, tmp_path / "run", method="rl", dtype="bfloat16", mini_batches=2)
    assert {p.dtype for p in run.params} == {torch.bfloat16} and len(run.params) == len(run.masters)
    before = [p.detach().clone() for p in run.params]
    result = run.train(batch)
    assert result.steps == 2
    for p, master in zip(run.params, run.masters, strict=True):
        assert master.dtype == torch.float32 and torch.equal(p.detach(), master.detach().to(torch.bfloat16))
        moments = run.optimizer.state[master]
        assert moments["exp_avg"].dtype == moments["exp_avg_sq"].dtype == torch.float32
    assert any(not torch.equal(p, b) for p, b in zip(run.params, before, strict=True))
    out = run.export_adapter(str(tmp_path / "v1"))
    assert {t.dtype for t in load_file(f"{out}/adapter_model.safetensors").values()} == {torch.bfloat16}
    follow = started(tiny_model_dir, tmp_path / "follow", parent=out, method="rl", dtype="bfloat16")
    assert follow.optimizer_resumed_at == 2 and {p.dtype for p in follow.params} == {torch.bfloat16}
    assert all(follow.optimizer.state[m]["exp_avg"].dtype == torch.float32 for m in follow.masters)

    resident.reset()
    jobs = [TenantJob(key, TrainConfig(device="cpu", dtype="bfloat16", method="rl", lr=1e-3),
                      str(tmp_path / f"pass-{key}"), sampled_batch(probe, prompts[i * 4 : i * 4 + 4], seed=i))
            for i, key in enumerate("AB")]
    with MultiTenantPass(str(tiny_model_dir), jobs) as mt:
        outcomes = mt.train()
        assert all(o.error is None and o.result.steps == 1 for o in outcomes)
        for backend in (o.backend for o in outcomes):
            assert {p.dtype for p in backend.params} == {torch.bfloat16}
            assert all(backend.optimizer.state[m]["exp_avg"].dtype == torch.float32 for m in backend.masters)
    resident.reset()
