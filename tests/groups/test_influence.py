"""Bounded influence: each member's share of a group update's advantage mass, on hand-computed cases, and
the weights a group run's claim writes and the trainer receives."""

import pytest

from clawhub.review.models import Sample
from clawhub.training import influence, services
from clawhub.training.influence import advantage_mass, member_weights
from clawhub.training.models import TrainingRun
from tests.factories import add_member, make_group, make_user
from tests.review.conftest import approved_sample


def shares(masses, weights):
    total = sum(weights[m] * masses[m] for m in masses)
    return {m: weights[m] * masses[m] / total for m in masses}


def test_advantage_mass_is_the_token_mean_of_abs_a():
    assert advantage_mass(method="rl", reward=-1, has_hint=True) == 1.0
    assert advantage_mass(method="rl", reward=0, has_hint=True) == 0.0
    assert advantage_mass(method="opd", reward=1, has_hint=False) == 0.0
    assert advantage_mass(method="opd", reward=1, has_hint=True, w_opd=0.5) == 0.5
    assert advantage_mass(method="combine", reward=-1, has_hint=True, w_rl=1.0, w_opd=0.5) == 1.5


def test_no_adversary_equal_volume_changes_nothing():
    assert member_weights({"h1": 4, "h2": 4, "h3": 4}, cap=0.4) == {"h1": 1.0, "h2": 1.0, "h3": 1.0}
    # Unequal honest volumes under the cap also keep weight 1: the update is the unweighted one.
    assert member_weights({"h1": 5, "h2": 4, "h3": 3}, cap=0.45) == {"h1": 1.0, "h2": 1.0, "h3": 1.0}


def test_one_adversary_among_three_supplying_half():
    # a = 8, h1 = h2 = 4, cap 0.4: x_a = 0.4 X and X = 8 + x_a, so X = 8 / 0.6 = 13.33 and x_a = 5.33:
    # w_a = 5.33 / 8 = 2/3; the shares become 0.4, 0.3, 0.3.
    masses = {"a": 8, "h1": 4, "h2": 4}
    weights = member_weights(masses, cap=0.4)
    assert weights["a"] == pytest.approx(2 / 3) and weights["h1"] == weights["h2"] == 1.0
    assert shares(masses, weights) == pytest.approx({"a": 0.4, "h1": 0.3, "h2": 0.3})


def test_two_adversaries_among_five():
    # a1 = a2 = 6, three honest of 2 each, cap 0.25: X = 6 + 2 (0.25 X), so X = 12 and x_a = 3: w_a = 0.5.
    masses = {"a1": 6, "a2": 6, "h1": 2, "h2": 2, "h3": 2}
    weights = member_weights(masses, cap=0.25)
    assert weights == pytest.approx({"a1": 0.5, "a2": 0.5, "h1": 1.0, "h2": 1.0, "h3": 1.0})
    assert shares(masses, weights)["a1"] == pytest.approx(0.25)


def test_the_cap_holds_over_the_window():
    # The adversary brought 6 of the window's 10 (0.6) before; this batch is even (4, 4, 4). Per update
    # alone nobody is over 0.4, but over the window (6 + x_a) / (10 + X) <= 0.4 with X = 8 + x_a gives
    # x_a = 0.4 (18 + x_a) - 6, so x_a = 2 and w_a = 0.5: the window share is 8 / 20 = 0.4.
    masses = {"a": 4, "h1": 4, "h2": 4}
    past = {"a": 6, "h1": 2, "h2": 2}
    weights = member_weights(masses, cap=0.4, past=past)
    assert weights == pytest.approx({"a": 0.5, "h1": 1.0, "h2": 1.0})
    assert member_weights(masses, cap=0.4) == {"a": 1.0, "h1": 1.0, "h2": 1.0}  # per update only
    x = {m: weights[m] * masses[m] for m in masses}
    assert (past["a"] + x["a"]) / (sum(past.values()) + sum(x.values())) == pytest.approx(0.4)


def test_fewer_members_than_the_cap_allows_means_equal_shares():
    # Two members and cap 0.4 cannot both be under 0.4: the bound is 1/2 each. x_a = 0.5 X, X = 1 + x_a:
    # X = 2, x_a = 1, w_a = 1/3.
    assert member_weights({"a": 3, "h": 1}, cap=0.4) == pytest.approx({"a": 1 / 3, "h": 1.0})
    assert member_weights({"solo": 5}, cap=0.4) == {"solo": 1.0}
    assert member_weights({"a": 0, "h": 0}, cap=0.4) == {"a": 1.0, "h": 1.0}


@pytest.fixture
def group_of_three(db, settings):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 8
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0
    settings.CLAWHUB_REVIEW_MEMBER_CAP = 0.5
    settings.CLAWHUB_INFLUENCE_CAP = 0.4
    settings.CLAWHUB_INFLUENCE_WINDOW = 4
    owner = make_user()
    group = make_group(owner)
    return group.tenant, owner, add_member(group), add_member(group)


def test_a_group_claim_weights_the_dominant_member_and_the_trainer_gets_it(group_of_three):
    from workers.tasks.training import train_sample

    tenant, adversary, h1, h2 = group_of_three
    for user, n in ((adversary, 4), (h1, 2), (h2, 2)):  # 4 of 8 is the count cap's 50 %
        for _ in range(n):
            approved_sample(user, tenant=tenant, reward=1)
    run = services.run_start(tenant=tenant)
    assert len(run.sample_ids) == 8
    # Masses 4, 2, 2 under cap 0.4: X = 4 / 0.6 = 6.67, x_a = 2.67, w_a = 2/3.
    samples = {s.pk: s for s in Sample.objects.filter(pk__in=run.sample_ids)}
    for s in samples.values():
        assert s.advantage_mass == 1.0
        assert s.train_weight == pytest.approx(2 / 3 if s.user_id == adversary.pk else 1.0)
    weights = {train_sample(s).member_id: train_sample(s).weight for s in samples.values()}
    assert weights == pytest.approx({adversary.pk: 2 / 3, h1.pk: 1.0, h2.pk: 1.0})


def test_the_window_remembers_what_earlier_runs_carried(group_of_three):
    tenant, adversary, h1, h2 = group_of_three
    # An earlier trained run in which the adversary carried 6 of 10.
    earlier = TrainingRun.objects.create(tenant=tenant, backend="local", method="rl",
                                         state=TrainingRun.State.SUCCEEDED)
    for user, n in ((adversary, 6), (h1, 2), (h2, 2)):
        for _ in range(n):
            s = approved_sample(user, tenant=tenant)
            Sample.objects.filter(pk=s.pk).update(training_run_id=earlier.pk, trained_at=s.created_at,
                                                  advantage_mass=1.0)
    assert influence.window_masses(tenant=tenant, window=4) == {adversary.pk: 6.0, h1.pk: 2.0, h2.pk: 2.0}
    assert influence.window_masses(tenant=tenant, window=0) == {}
    fresh = [approved_sample(u, tenant=tenant) for u in (adversary, h1, h2) for _ in range(2)]
    weights = influence.batch_weights_set(tenant=tenant, sample_ids=[s.pk for s in fresh], method="rl",
                                          config={})
    # Batch 2, 2, 2; window (6 + x_a) / (10 + 4 + x_a) <= 0.4: x_a = 0.4 (14 + x_a) - 6 = -0.4 / 0.6 < 0,
    # so the adversary's weight is 0 in this update; the honest members keep 1.
    assert weights == pytest.approx({adversary.pk: 0.0, h1.pk: 1.0, h2.pk: 1.0})


def test_a_personal_tenant_keeps_weight_one(db, settings):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 4
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0
    user = make_user()
    for _ in range(4):
        approved_sample(user, reward=-1)
    run = services.run_start(tenant=user.tenant)
    assert set(Sample.objects.filter(pk__in=run.sample_ids).values_list("train_weight", flat=True)) == {1.0}


def test_the_group_page_shows_each_members_share_weight_flags_and_rejections(group_of_three, settings):
    from django.test import Client

    from clawhub.review.flags import CONSENSUS
    from clawhub.review.services import sample_reject
    from clawhub.tenants.access import review_access
    from tests.adapters.conftest import make_version

    tenant, adversary, h1, h2 = group_of_three
    owner = adversary  # the group's owner is the one who supplies most here
    for user, n in ((adversary, 4), (h1, 2), (h2, 2)):
        for _ in range(n):
            approved_sample(user, tenant=tenant, reward=1)
    run = services.run_start(tenant=tenant)
    version = make_version(tenant, 1, state="active")
    TrainingRun.objects.filter(pk=run.pk).update(state=TrainingRun.State.SUCCEEDED, adapter_version=version)
    # One flagged sample of h1, rejected by the owner.
    flagged = approved_sample(h1, tenant=tenant, reward=-1)
    Sample.objects.filter(pk=flagged.pk).update(
        state=Sample.State.PENDING,
        flags=[{"code": CONSENSUS, "detail": "rewarded 5 of 6 against the group"}])
    sample_reject(access=review_access(actor=owner, tenant=tenant), sample_id=flagged.pk,
                  reason="steers against the group")

    from clawhub.training.selectors import group_member_influence

    versions, rows = group_member_influence(group=tenant.group)
    assert versions == [1]
    by_user = {r.user.pk: r for r in rows}
    # Masses 4, 2, 2 with w_a = 2/3: weighted 2.67, 2, 2 of 6.67 -> 40 %, 30 %, 30 %.
    assert by_user[adversary.pk].shares == [pytest.approx(0.4)]
    assert by_user[h1.pk].shares == [pytest.approx(0.3)] and by_user[h2.pk].shares == [pytest.approx(0.3)]
    assert by_user[adversary.pk].min_weight == pytest.approx(2 / 3) and by_user[h1.pk].min_weight == 1.0
    assert (by_user[h1.pk].flagged, by_user[h1.pk].rejected) == (1, 1)
    assert by_user[h1.pk].consensus.startswith("rewarded 5 of 6")
    assert (by_user[h2.pk].flagged, by_user[h2.pk].rejected) == (0, 0)

    client = Client()
    client.force_login(owner)
    html = client.get(f"/groups/{tenant.group.slug}/").content.decode()
    section = html[html.index('id="influence"'):]
    assert "<th>v1</th>" in section and "40 %" in section and "30 %" in section and "0.67" in section
    assert "consensus: rewarded 5 of 6" in section
    member = Client()
    member.force_login(h2)
    html = member.get(f"/groups/{tenant.group.slug}/").content.decode()
    section = html[html.index('id="influence"'):]
    assert "40 %" in section and "consensus:" not in section  # shares for everyone, flags for managers


# --- the optional robust aggregation: each member's mass clipped to the median member's ------------------


def test_median_clip_on_hand_computed_cases():
    from clawhub.training.influence import median_clip_weights

    # None: equal honest volumes keep weight 1; (5, 4, 3): median 4, only the busiest loses a fifth.
    assert median_clip_weights({"h1": 4, "h2": 4, "h3": 4}) == {"h1": 1.0, "h2": 1.0, "h3": 1.0}
    assert median_clip_weights({"h1": 5, "h2": 4, "h3": 3}) == pytest.approx({"h1": 0.8, "h2": 1, "h3": 1})
    # One adversary among three supplying half (8, 4, 4): median 4, w_a = 1/2, equal masses 4, 4, 4.
    assert median_clip_weights({"a": 8, "h1": 4, "h2": 4}) == pytest.approx({"a": 0.5, "h1": 1.0, "h2": 1.0})
    # Two among five (6, 6, 2, 2, 2): median 2, w_a = 1/3.
    masses = {"a1": 6, "a2": 6, "h1": 2, "h2": 2, "h3": 2}
    assert median_clip_weights(masses) == pytest.approx({"a1": 1 / 3, "a2": 1 / 3, "h1": 1, "h2": 1, "h3": 1})
    assert median_clip_weights({"solo": 5}) == {"solo": 1.0}


def test_robust_weights_take_the_smaller_of_the_cap_and_the_clip():
    from clawhub.training.influence import robust_weights

    masses = {"a": 8, "h1": 4, "h2": 4}
    assert robust_weights(masses, cap=0.4, past=None, aggregation="none")["a"] == pytest.approx(2 / 3)
    assert robust_weights(masses, cap=0.4, past=None, aggregation="median_clip")["a"] == pytest.approx(0.5)
    # Over the window the cap can be the tighter one (0 here, see test_the_window_remembers...).
    past = {"a": 6, "h1": 2, "h2": 2}
    weights = robust_weights({"a": 2, "h1": 2, "h2": 2}, cap=0.4, past=past, aggregation="median_clip")
    assert weights == pytest.approx({"a": 0.0, "h1": 1.0, "h2": 1.0})
    with pytest.raises(ValueError):
        robust_weights(masses, cap=0.4, past=None, aggregation="trimmed")


def test_a_group_claim_uses_the_robust_aggregation_when_it_is_set(group_of_three, settings):
    tenant, adversary, h1, h2 = group_of_three
    settings.CLAWHUB_INFLUENCE_AGGREGATION = "median_clip"
    for user, n in ((adversary, 4), (h1, 2), (h2, 2)):
        for _ in range(n):
            approved_sample(user, tenant=tenant, reward=1)
    run = services.run_start(tenant=tenant)
    # Masses 4, 2, 2: the cap gives the adversary 2/3, the median clip 2/4; the smaller one is written.
    weights = dict(Sample.objects.filter(pk__in=run.sample_ids).values_list("user_id", "train_weight"))
    assert weights == pytest.approx({adversary.pk: 0.5, h1.pk: 1.0, h2.pk: 1.0})


def _update(per_member: dict[str, tuple[int, int]], weights: dict[str, float], seed: int = 0):
    """The gradient of the trainer's own Binary RL loss (workers.trainer.losses) for one batch, on a toy
    policy (one logit vector over 32 tokens). per_member: member -> (samples, reward). Every member's replies
    are drawn from the same distribution, as honest members of one group chat about the same things."""
    import torch

    from workers.trainer import losses

    g = torch.Generator().manual_seed(seed)
    logits = torch.zeros(32, requires_grad=True)
    rows, rewards, sample_weights = [], [], []
    for member, (n, reward) in per_member.items():
        for _ in range(n):
            rows.append(torch.randint(0, 32, (12,), generator=g))
            rewards.append(float(reward))
            sample_weights.append(weights[member])
    tokens = torch.stack(rows)
    logp = torch.log_softmax(logits, -1)[tokens]
    mask = torch.ones_like(logp)
    advantages, mask = losses.binary_rl_advantages(torch.tensor(rewards), mask)
    out = losses.policy_loss(logp, logp.detach(), advantages, mask, weights=torch.tensor(sample_weights))
    (grad,) = torch.autograd.grad(out.loss, logits)
    return grad


def test_with_honest_members_the_robust_aggregation_changes_the_update_little():
    import torch

    from clawhub.training.influence import robust_weights

    def change(per_member, seed):
        """(relative change of the update's norm, cosine between the two updates)."""
        masses = {m: float(n) for m, (n, _) in per_member.items()}
        plain = _update(per_member, {m: 1.0 for m in per_member}, seed)
        weights = robust_weights(masses, cap=0.4, past=None, aggregation="median_clip")
        robust = _update(per_member, weights, seed)
        cosine = float(torch.nn.functional.cosine_similarity(plain, robust, dim=0))
        return float((robust - plain).norm() / plain.norm()), cosine

    def mean_change(per_member):
        found = [change(per_member, seed) for seed in range(5)]
        return sum(r for r, _ in found) / len(found), min(c for _, c in found)

    # Honest batches as the bench claims them (16 claimed, 4 held out for the gate), all members correcting
    # the same kind of reply (reward -1). Equal volumes: nobody is above the median, the update is the same.
    assert mean_change({"h1": (4, -1), "h2": (4, -1), "h3": (4, -1)}) == (0.0, pytest.approx(1.0))
    # 5, 4, 3: the busiest member's weight is 4/5, a twelfth of the batch's mass; on this toy policy (random
    # tokens per reply, so the per-reply gradients are noisy) the update moves by 13 % on average over five
    # draws and keeps its direction (cosine > 0.99).
    relative, cosine = mean_change({"h1": (5, -1), "h2": (4, -1), "h3": (3, -1)})
    assert relative < 0.2 and cosine > 0.99
    # With an adversary who supplies 8 of 14 with the opposite reward, it changes the update four times as
    # much: the aggregation is not a no-op that the honest case would pass trivially.
    adversarial, _ = mean_change({"a": (8, 1), "h1": (3, -1), "h2": (3, -1)})
    assert adversarial > 0.4 and adversarial > 3 * relative


def test_honest_members_keep_training_when_the_adversarys_samples_are_gone_from_the_batch():
    # The persona bench's adversarial group: the window carried h1 5, h2 4 and the adversary 3 (P = 12); the
    # adversary's new samples were rejected, so the batch is h1 7, h2 5. Two members in the batch: equal
    # shares at most, per update and over the window (c = 1/2). x_h2 = 5, x_h1 = 0.5 X, so X = 10 and
    # w_h1 = 5/7; over the window h1 carries (5 + 5) / 22 = 0.45 <= 0.5. With the window's cap at 0.4 (three
    # members in the window), both honest members would need under 0.4 of a window where the adversary's 3
    # only shrinks: the whole batch went to weight ~0 (h1 0, h2 0.07).
    weights = member_weights({"h1": 7, "h2": 5}, cap=0.4, past={"h1": 5, "h2": 4, "a": 3})
    assert weights == pytest.approx({"h1": 5 / 7, "h2": 1.0})


def test_a_member_alone_in_a_batch_may_carry_at_most_half_of_the_window():
    # Past: a 2, h1 4, h2 4 (P = 10); a alone with 10: (2 + x) / (10 + x) <= 1/2, so x = 6 and w_a = 0.6.
    assert member_weights({"a": 10}, cap=0.4, past={"a": 2, "h1": 4, "h2": 4}) == pytest.approx({"a": 0.6})
    # Already carrying 0.6 of the window: nothing more while alone.
    assert member_weights({"a": 4}, cap=0.4, past={"a": 6, "h1": 2, "h2": 2}) == pytest.approx({"a": 0.0})
