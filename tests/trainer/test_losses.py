"""The objectives against numbers worked out by hand (PPO clip eps_low 0.2, eps_high 0.28)."""

import math

import pytest
import torch

from workers.trainer.losses import (
    aggregate,
    binary_rl_advantages,
    clipped_surrogate,
    combine_advantages,
    kl_k3,
    masked_mean_per_sample,
    opd_advantages,
    policy_loss,
    ratio,
    token_logprobs,
)

LOG_HALF = math.log(0.5)


def logps_with_ratios(ratios):
    """(logp_new, logp_old) whose ratio pi_new / pi_old is exactly `ratios`, around pi_old = 0.5."""
    old = torch.full((len(ratios),), LOG_HALF)
    new = old + torch.log(torch.tensor(ratios))
    return new, old


def test_ratio_is_exp_of_the_logprob_difference():
    new, old = logps_with_ratios([1.5, 0.5, 1.1])
    assert torch.allclose(ratio(new, old), torch.tensor([1.5, 0.5, 1.1]))


def test_clipped_surrogate_positive_advantage_clips_only_above():
    # A = +1: max(-rho, -clip(rho, 0.8, 1.28))
    #   rho 1.5 -> max(-1.5, -1.28) = -1.28 (clipped: no reward for moving further)
    #   rho 0.5 -> max(-0.5, -0.8)  = -0.5  (below the range the unclipped term wins: still pushed up)
    #   rho 1.1 -> -1.1 (inside the range)
    new, old = logps_with_ratios([1.5, 0.5, 1.1])
    loss = clipped_surrogate(new, old, torch.ones(3), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([-1.28, -0.5, -1.1]))


def test_clipped_surrogate_negative_advantage_clips_only_below():
    # A = -1: max(rho, clip(rho, 0.8, 1.28)): 1.5 -> 1.5, 0.5 -> 0.8 (clipped), 1.1 -> 1.1
    new, old = logps_with_ratios([1.5, 0.5, 1.1])
    loss = clipped_surrogate(new, old, -torch.ones(3), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([1.5, 0.8, 1.1]))


def test_clipped_surrogate_scales_with_the_advantage_and_uses_asymmetric_bounds():
    # A = 2, rho 1.5 -> max(-3.0, -2 * 1.28) = -2.56; A = -0.5, rho 0.7 -> max(0.35, 0.5 * 0.8) = 0.4
    new, old = logps_with_ratios([1.5, 0.7])
    loss = clipped_surrogate(new, old, torch.tensor([2.0, -0.5]), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([-2.56, 0.4]))


def test_gradient_is_zero_where_clipped_and_minus_a_rho_elsewhere():
    new, old = logps_with_ratios([1.5, 0.5, 1.1])
    new.requires_grad_(True)
    clipped_surrogate(new, old, torch.ones(3)).sum().backward()
    # d(-rho)/d logp_new = -rho; the clipped token contributes nothing.
    assert torch.allclose(new.grad, torch.tensor([0.0, -0.5, -1.1]))


def test_masked_token_mean_per_sample_then_mean_over_samples():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 5.0, 7.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(masked_mean_per_sample(values, mask), torch.tensor([1.5, 5.0, 0.0]))
    # The padded 100 and the fully masked third sample are ignored: (1.5 + 5.0) / 2.
    assert aggregate(values, mask).item() == pytest.approx(3.25)
    # Gradient accumulation passes the step's sample count: (1.5 + 5.0) / 4.
    assert aggregate(values, mask, num_samples=4).item() == pytest.approx(1.625)


def test_sample_mean_weights_samples_not_tokens():
    # A long sample must not outweigh a short one: per-sample means 1.0 and 3.0 -> 2.0 (token mean: 2.6).
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert aggregate(values, mask).item() == pytest.approx(2.0)


def test_binary_rl_advantage_is_the_reward_and_masks_zero_rewards():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    advantages, keep = binary_rl_advantages(torch.tensor([1, -1, 0]), mask)
    assert advantages.tolist() == [[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]]
    assert keep.tolist() == [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]


def test_opd_advantage_is_teacher_minus_old_only_with_a_hint():
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    teacher = torch.tensor([[-0.5, -2.5], [-3.0, -3.0]])
    advantages, keep = opd_advantages(teacher, old, torch.tensor([True, False]), torch.ones(2, 2))
    assert torch.allclose(advantages, torch.tensor([[0.5, -0.5], [0.0, 0.0]]))
    assert keep.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def combine_case(reward: int, hint: bool, w_opd=1.0, w_rl=1.0):
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    teacher = old + torch.tensor([[0.3, -0.2, 0.1]])  # teacher - old = [0.3, -0.2, 0.1]
    return combine_advantages(
        teacher, old, torch.tensor([reward]), torch.tensor([hint]), torch.ones(1, 3), w_opd, w_rl
    )


def test_combine_score_only_is_pure_binary_rl():
    advantages, keep = combine_case(reward=1, hint=False)
    assert torch.allclose(advantages, torch.tensor([[1.0, 1.0, 1.0]]))
    assert keep.tolist() == [[1.0, 1.0, 1.0]]


def test_combine_hint_only_is_pure_opd():
    advantages, keep = combine_case(reward=0, hint=True)
    assert torch.allclose(advantages, torch.tensor([[0.3, -0.2, 0.1]]))
    assert keep.tolist() == [[1.0, 1.0, 1.0]]


def test_combine_both_adds_the_weighted_terms():
    advantages, _ = combine_case(reward=-1, hint=True)
    assert torch.allclose(advantages, torch.tensor([[-0.7, -1.2, -0.9]]))
    # 0.5 * [0.3, -0.2, 0.1] + 2 * (-1)
    advantages, _ = combine_case(reward=-1, hint=True, w_opd=0.5, w_rl=2.0)
    assert torch.allclose(advantages, torch.tensor([[-1.85, -2.1, -1.95]]))


def test_combine_neither_is_masked():
    _, keep = combine_case(reward=0, hint=False)
    assert keep.tolist() == [[0.0, 0.0, 0.0]]


def test_kl_k3_by_hand_and_zero_at_equality():
    # pi_new = 0.5, pi_ref = 0.25: d = log 0.5; exp(d) - d - 1 = 0.5 + ln 2 - 1
    value = kl_k3(torch.tensor([LOG_HALF, LOG_HALF]), torch.tensor([math.log(0.25), LOG_HALF]))
    assert value[0].item() == pytest.approx(0.5 + math.log(2) - 1)
    assert value[1].item() == pytest.approx(0.0)


def test_policy_loss_combines_surrogate_kl_and_clip_fraction():
    new, old = logps_with_ratios([1.5, 0.5, 1.1])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    out = policy_loss(new[None], old[None], torch.ones(1, 3), mask)
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 - 1.1) / 3)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)  # 1.5 and 0.5 lie outside [0.8, 1.28]
    # With a reference equal to pi_old: k3 per token = rho^-1 - 1 + ln rho.
    out = policy_loss(new[None], old[None], torch.ones(1, 3), mask, kl_coef=0.1, logp_ref=old[None])
    k3 = [1 / r - 1 + math.log(r) for r in (1.5, 0.5, 1.1)]
    assert out.kl.item() == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 - 1.1) / 3 + 0.1 * sum(k3) / 3, rel=1e-5)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(new[None], old[None], torch.ones(1, 3), mask, kl_coef=0.1)


def test_sample_weights_scale_each_samples_surrogate_and_kl_but_not_the_denominator():
    # Two samples, rho = 1 everywhere (no clipping): the surrogate per token is -A. Sample 0 has A = +1 on 2
    # tokens, sample 1 has A = -1 on 1 token (the second position masked). Unweighted: (-1 + 1) / 2 = 0.
    # Weights (1.0, 0.25): (-1 * 1.0 + 1 * 0.25) / 2 = -0.375; the denominator stays 2 samples.
    logp = torch.full((2, 2), LOG_HALF)
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert policy_loss(logp, logp, advantages, mask).loss.item() == pytest.approx(0.0)
    weights = torch.tensor([1.0, 0.25])
    assert policy_loss(logp, logp, advantages, mask, weights=weights).loss.item() == pytest.approx(-0.375)
    # Weight 0 removes the sample's pull entirely, KL term included: the gradient on its log-probs is zero.
    new = logp.clone().requires_grad_(True)
    ref = logp + 0.1
    weights = torch.tensor([1.0, 0.0])
    out = policy_loss(new, logp, advantages, mask, kl_coef=0.5, logp_ref=ref, weights=weights)
    out.loss.backward()
    assert torch.all(new.grad[1] == 0) and torch.all(new.grad[0] != 0)
    k3 = math.exp(0.1) - 0.1 - 1  # per token of sample 0, log pi_ref - log pi_new = 0.1
    assert out.kl.item() == pytest.approx(k3 / 2, rel=1e-5)


def test_token_logprobs_is_log_softmax_at_the_target():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # softmax = [0.25, 0.75]
    assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    assert token_logprobs(logits.bfloat16(), torch.tensor([[0]])).dtype == torch.float32
