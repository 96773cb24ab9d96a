"""Optimizer continuity: a version's AdamW state travels with its adapter, so runs of one batch each add up to
one continuous optimisation (and a run's single step is not Adam's sign-like first step); several mini-batch
steps per batch are clipped against the same pi_old."""

import pytest
import torch

from tests.trainer.conftest import sampled_batch
from tests.trainer.test_local import adapter_weights, started
from workers.trainer.backend import OPTIMIZER_STATE_DIR, TrainConfig


def moments(backend) -> dict[str, dict[str, torch.Tensor]]:
    names = {id(p): n for n, p in backend.model.named_parameters() if p.requires_grad}
    return {names[id(p)]: s for p, s in backend.optimizer.state.items()}


def sign_step_fraction(before, after, lr) -> float:
    """Of the elements that moved, the share that moved by lr (within 1%): ~1.0 for Adam's first step."""
    moved = ratio = 0
    for name, w in before.items():
        delta = (after[name] - w).abs() / lr
        changed = delta > 0.05
        moved += int(changed.sum())
        ratio += int(((delta - 1).abs() < 0.01)[changed].sum())
    return ratio / max(moved, 1)


@pytest.mark.slow
def test_two_runs_of_one_batch_each_equal_one_continuous_run(tiny_model_dir, tmp_path, prompts):
    config = {"method": "rl", "micro_batch_size": 4, "lr": 1e-3}
    probe = started(tiny_model_dir, tmp_path / "probe")
    first = sampled_batch(probe, prompts[:8], seed=11)
    second = sampled_batch(probe, prompts[8:16], seed=12, first_id=100)
    assert {s.reward for s in first} == {-1, 1} and {s.reward for s in second} == {-1, 1}

    continuous = started(tiny_model_dir, tmp_path / "continuous", **config)
    continuous.train(first)
    continuous.train(second)

    v1_run = started(tiny_model_dir, tmp_path / "run-1", **config)
    v1_run.train(first)
    v1 = v1_run.export_adapter(str(tmp_path / "adapters" / "v1"))
    assert (tmp_path / "adapters" / "v1" / OPTIMIZER_STATE_DIR / "local" / "optimizer.pt").exists()

    v2_run = started(tiny_model_dir, tmp_path / "run-2", parent=v1, **config)
    assert v2_run.optimizer_resumed_at == 1 and v2_run.optimizer_note == ""
    before = adapter_weights(v2_run)
    result = v2_run.train(second)
    assert result.optimizer_resumed_at == 1

    expected, got = adapter_weights(continuous), adapter_weights(v2_run)
    for name in expected:
        assert torch.allclose(expected[name], got[name], atol=1e-6), name
    expected_m, got_m = moments(continuous), moments(v2_run)
    assert set(expected_m) == set(got_m) == set(expected)
    for name, state in expected_m.items():
        assert int(got_m[name]["step"]) == int(state["step"]) == 2, name
        assert torch.allclose(state["exp_avg"], got_m[name]["exp_avg"], atol=1e-9), name
        assert torch.allclose(state["exp_avg_sq"], got_m[name]["exp_avg_sq"], atol=1e-12), name

    # The continued run's update is shaped by the gradient's history, not lr * sign(g); a fresh optimizer on
    # the same parent and batch takes the sign step (which is what the test would catch if restore broke).
    assert sign_step_fraction(before, got, lr=1e-3) < 0.5
    fresh = started(tiny_model_dir, tmp_path / "fresh", **config)
    fresh_before = adapter_weights(fresh)
    fresh.train(first)
    assert sign_step_fraction(fresh_before, adapter_weights(fresh), lr=1e-3) > 0.9


def test_a_parent_without_optimizer_state_starts_fresh_and_says_why(tiny_model_dir, tmp_path):
    from workers.tiny_model.builder import make_lora_adapter

    parent = make_lora_adapter(tiny_model_dir, tmp_path / "parent", seed=1, rank=8, alpha=16)
    backend = started(tiny_model_dir, tmp_path / "run", parent=str(parent), method="rl")
    assert backend.optimizer_resumed_at is None
    assert "no optimizer state" in backend.optimizer_note
    assert not backend.optimizer.state


@pytest.mark.slow
def test_mini_batch_steps_are_clipped_against_the_policy_at_the_start(tiny_model_dir, tmp_path, prompts):
    """Four mini-batch steps with pi_old fixed at the start of the call: step 1 has rho = 1 (nothing clipped),
    and with a large lr the later epochs' ratios leave the clip range (the trust region acts)."""
    backend = started(
        tiny_model_dir, tmp_path / "run", method="rl", micro_batch_size=4, mini_batches=2, epochs=2, lr=3e-2
    )
    batch = sampled_batch(backend, prompts[:8], seed=13)
    result = backend.train(batch)
    assert [m.samples for m in result.metrics] == [4, 4, 4, 4]
    assert result.metrics[0].clip_fraction == 0.0
    assert max(m.clip_fraction for m in result.metrics[1:]) > 0.0


def test_step_sizes_split_a_batch_into_near_equal_mini_batches():
    assert TrainConfig(mini_batches=3).step_sizes(16) == [6, 5, 5]
    assert TrainConfig(mini_batches=4).step_sizes(2) == [1, 1]
    assert TrainConfig().step_sizes(16) == [16]
    assert TrainConfig(micro_batch_size=2, grad_accum=3, mini_batches=5).step_sizes(10) == [6, 4]
    assert TrainConfig(mini_batches=4, epochs=3, max_steps=10).planned_steps(16) == 10
    with pytest.raises(ValueError, match="mini_batches=0"):
        TrainConfig(mini_batches=0)
    with pytest.raises(ValueError, match="old_policy='behaviour'"):
        TrainConfig(old_policy="behaviour")
