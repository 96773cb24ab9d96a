"""Log-probs of the distribution the sampler drew from (temperature, top-k, top-p) and the OPD clip, against
numbers worked out by hand.

The logits are log([0.4, 0.3, 0.2, 0.1]): at temperature 1 the probabilities are exactly those. At
temperature T each probability becomes p^(1/T), renormalised: at T = 0.5, [0.16, 0.09, 0.04, 0.01] / 0.30.
"""

import math

import pytest
import torch

from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.batching import recorded_logprobs
from workers.trainer.losses import (
    Sampler,
    chunked_token_logprobs,
    combine_advantages,
    opd_advantages,
    sampled_logprobs,
)

PROBS = [0.4, 0.3, 0.2, 0.1]


def logits(rows: int = 1) -> torch.Tensor:
    return torch.log(torch.tensor([PROBS] * rows, dtype=torch.float64))


def sampler(temperature, top_p=None, top_k=None) -> Sampler:
    return Sampler(
        torch.tensor([temperature], dtype=torch.float64),
        None if top_p is None else torch.tensor([top_p], dtype=torch.float64),
        None if top_k is None else torch.tensor([top_k]),
    )


@pytest.mark.parametrize(
    ("target", "how", "expected"),
    [
        # Temperature 1, nothing filtered: the softmax itself.
        (1, sampler(1.0), math.log(0.3)),
        # T = 0.5: p^2 renormalised: 0.16 / 0.30 and 0.01 / 0.30.
        (0, sampler(0.5), math.log(0.16 / 0.30)),
        (3, sampler(0.5), math.log(0.01 / 0.30)),
        # T = 2: sqrt(p) renormalised.
        (0, sampler(2.0), math.log(math.sqrt(0.4) / sum(math.sqrt(p) for p in PROBS))),
        # T = 0.5 then top-k 2: {0.16, 0.09} / 0.25.
        (1, sampler(0.5, top_k=2), math.log(0.09 / 0.25)),
        # Top-p 0.65 at T = 1: ascending 0.1, 0.2, 0.3, 0.4 has running sums 0.1, 0.3, 0.6, 1.0; those at
        # most 1 - 0.65 = 0.35 (0.1 and 0.2) are dropped: {0.4, 0.3} / 0.7.
        (0, sampler(1.0, top_p=0.65), math.log(0.4 / 0.7)),
        # Top-k before top-p, top-p over what top-k left: T = 0.5, top-k 3 leaves [0.16, 0.09, 0.04] / 0.29;
        # its smallest (0.04 / 0.29 = 0.138) is below 1 - 0.8 = 0.2 and dropped: {0.16, 0.09} / 0.25.
        (0, sampler(0.5, top_p=0.8, top_k=3), math.log(0.16 / 0.25)),
        # A target outside the set stays in it (it was sampled under pi_old): top-k 1 leaves {0.4} and the
        # target 0.2 joins it, 0.2 / 0.6.
        (2, sampler(1.0, top_k=1), math.log(0.2 / 0.6)),
    ],
)
def test_logprobs_of_the_sampled_distribution_equal_the_hand_computation(target, how, expected):
    got = sampled_logprobs(logits(), torch.tensor([target]), how)
    assert got.item() == pytest.approx(expected, abs=1e-12)


def test_no_sampler_is_the_plain_softmax():
    assert sampled_logprobs(logits(), torch.tensor([2]), None).item() == pytest.approx(math.log(0.2))


def test_each_position_has_its_own_sampler():
    # Three positions, three samplers: T = 0.5; top-k 2 at T = 1; plain.
    how = Sampler(
        torch.tensor([0.5, 1.0, 1.0], dtype=torch.float64),
        None,
        torch.tensor([0, 2, 0]),
    )
    got = sampled_logprobs(logits(3), torch.tensor([0, 1, 1]), how)
    expected = [math.log(0.16 / 0.30), math.log(0.3 / 0.7), math.log(0.3)]
    assert got.tolist() == pytest.approx(expected, abs=1e-12)


def test_the_gradient_stays_finite_for_a_target_outside_the_set():
    z = logits().requires_grad_(True)
    sampled_logprobs(z, torch.tensor([3]), sampler(0.5, top_k=1)).sum().backward()
    # The set is {0, 3} at T = 0.5: d/dz_3 log softmax = (1 - p_3) / T, p_3 = 0.01 / 0.17; tokens 1 and 2
    # are out of the set and get no gradient.
    assert torch.isfinite(z.grad).all()
    assert z.grad[0, 3].item() == pytest.approx((1 - 0.01 / 0.17) / 0.5)
    assert z.grad[0, 1].item() == 0.0 and z.grad[0, 2].item() == 0.0


def test_chunked_head_uses_the_sampler_per_position():
    # A head that is the identity on a 4-dim hidden state: the hidden states are the logits.
    head = torch.nn.Linear(4, 4, bias=False, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.eye(4, dtype=torch.float64))
    hidden = logits(2)
    how = Sampler(
        torch.tensor([0.5, 1.0], dtype=torch.float64), torch.tensor([1.0, 0.65], dtype=torch.float64)
    )
    logp, entropy, _ = chunked_token_logprobs(hidden, torch.tensor([0, 0]), head, chunk=1, sampler=how)
    assert logp.tolist() == pytest.approx([math.log(0.16 / 0.30), math.log(0.4 / 0.7)], abs=1e-12)
    # Entropy of {4/7, 3/7}: the dropped tokens count 0, not nan.
    assert entropy[1].item() == pytest.approx(-(4 / 7) * math.log(4 / 7) - (3 / 7) * math.log(3 / 7))


def test_sampler_of_plain_samples_costs_nothing():
    assert Sampler.of([(1.0, 1.0, 0), (1.0, 1.0, 0)]) is None
    how = Sampler.of([(0.6, 1.0, 0), (1.0, 1.0, 0)])
    assert how.temperature.tolist() == [0.6, 1.0] and how.top_p is None and how.top_k is None


# ------------------------------------------------------------------------------------------ OPD clip


def test_opd_advantage_is_clipped_before_its_weight():
    # teacher - old = [3.0, -0.5, -2.5]; clipped to +-1: [1.0, -0.5, -1.0]; times w_opd 0.5.
    old = torch.tensor([[-3.0, -1.0, -0.5]])
    teacher = torch.tensor([[0.0, -1.5, -3.0]])
    mask = torch.ones(1, 3)
    advantages, _ = opd_advantages(teacher, old, torch.tensor([True]), mask, w_opd=0.5, clip=1.0)
    assert advantages.tolist() == [[0.5, -0.25, -0.5]]
    unclipped, _ = opd_advantages(teacher, old, torch.tensor([True]), mask, w_opd=0.5)
    assert unclipped.tolist() == [[1.5, -0.25, -1.25]]


def test_combine_clips_the_opd_term_not_the_reward():
    # clip 2: [3.0, -0.5, -2.5] -> [2.0, -0.5, -2.0]; + w_rl * r = +1 each.
    old = torch.tensor([[-3.0, -1.0, -0.5]])
    teacher = torch.tensor([[0.0, -1.5, -3.0]])
    advantages, _ = combine_advantages(
        teacher, old, torch.tensor([1.0]), torch.tensor([True]), torch.ones(1, 3), clip=2.0
    )
    assert advantages.tolist() == [[3.0, 0.5, -1.0]]


def test_config_defaults_follow_openclaw_rl_lora():
    config = TrainConfig()
    assert (config.lr, config.opd_clip, config.old_policy) == (1e-4, 1.0, "recorded")
    with pytest.raises(ValueError, match="opd_clip"):
        TrainConfig(opd_clip=0.0)
    with pytest.raises(ValueError, match="max_version_lag"):
        TrainConfig(max_version_lag=-1)


# ------------------------------------------------------------------------------------------ recorded pi_old


def sample(**kw) -> TrainSample:
    return TrainSample(sample_id=1, messages=[{"role": "user", "content": "hi"}], response_text="x", **kw)


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"response_logprobs": [-0.5, -1.0], "logprobs_mode": "processed_logprobs", "temperature": 0.6}, ""),
        ({"response_logprobs": [-0.5, -1.0], "logprobs_mode": "raw_logprobs"}, ""),
        ({"response_logprobs": [-0.5, -1.0], "logprobs_mode": "raw_logprobs", "temperature": 0.6},
         "raw log-probs (before temperature / top-k / top-p)"),
        ({"response_logprobs": [-0.5, -1.0], "logprobs_mode": "raw_logprobs", "top_p": 0.95},
         "raw log-probs (before temperature / top-k / top-p)"),
        ({"response_logprobs": [-0.5, -1.0], "logprobs_mode": "processed_logprobs", "temperature": 0.0},
         "greedy decoding"),
        ({"response_logprobs": [-0.5, -1.0]}, "unknown log-probs mode"),
        ({"response_logprobs": [-0.5], "logprobs_mode": "processed_logprobs"}, "1 recorded logprobs for 2"),
        ({"response_logprobs": [-0.5, float("nan")], "logprobs_mode": "processed_logprobs"}, "finite"),
        ({"response_logprobs": [-0.5, 0.7], "logprobs_mode": "processed_logprobs"}, "finite and <= 0"),
        ({"logprobs_mode": "processed_logprobs"}, "no recorded logprobs"),
    ],
)
def test_recorded_logprobs_are_pi_old_only_when_valid(kw, why):
    logprobs, reason = recorded_logprobs(sample(**kw), [5, 6])
    if why:
        assert logprobs is None and why in reason
    else:
        assert logprobs == [-0.5, -1.0] and reason == ""
