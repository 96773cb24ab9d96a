"""Bounded influence: no member of a group carries more than a set share of what an update learns.

The per-member cap on batch *counts* (review.selectors.samples_for_training) still lets one member of three
supply a third to a half of every batch. What steers the adapter is the advantage mass each member's samples
bring to the loss, so that is what is bounded here: when a group run claims its batch, every sample gets a
loss weight (``review.Sample.train_weight``, carried to the trainer as ``TrainSample.weight``) such that

- per update: member m's share of the batch's weighted mass, w_m M_m / sum_k w_k M_k, is at most ``cap``;
- over a sliding window: the same share over this batch and the ``window`` previous trained runs of the
  tenant, (P_m + w_m M_m) / (P + sum_k w_k M_k), is at most ``cap`` too (P: the weighted mass each member
  brought to those runs, as recorded on their samples), so a member cannot spread a push over updates.

Members under the cap keep weight 1: with honest members of similar volume nothing changes at all, and the
update is the unweighted one. A weight only ever shrinks (never above 1), so the cap cannot be used to inflate
anyone's pull. When a batch has fewer than 1 / cap members, the cap cannot hold for all of them; it is then
equal shares (1 / members of the batch) instead, per update and over the window alike (over the window at
most 1 / 2 for a member alone in a batch while others are in the window, so a lone member cannot take over
the window). The window too, because the members who bring nothing to this batch cannot be weighted: with
cap 0.4, a group of three whose
adversary's samples were all rejected would otherwise need each of the two honest members under 0.4 of a
window where the adversary's old share only shrinks, and the fixed point is x = 0 (the persona bench's
adversarial group trained a whole batch at weight 0 so).

A sample's mass is its advantage mass as the loss weighs it: sum_t |A_t| over its response tokens, divided by
its token count, because the loss takes the token mean per sample (workers.trainer.losses.aggregate). For
Binary RL, A_t = r on every token, so the mass is |r| = 1 for every trainable sample, whatever its length:
a member cannot buy influence with long replies. For OPD the teacher's log-probs are only known inside the
trainer, so a hinted sample counts as w_opd per token (the OPD advantage is a log-ratio, of order one on the
tokens a hint changes); Combine adds both terms.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from django.conf import settings
from django.db.models import F, Sum

from clawhub.review.models import Sample
from clawhub.tenants.models import Tenant
from clawhub.training.models import TrainingRun

ITERATIONS = 200
TOLERANCE = 1e-12


def advantage_mass(*, method: str, reward: int, has_hint: bool, w_rl: float = 1.0,
                   w_opd: float = 1.0) -> float:
    """Token-mean |A_t| of one sample under ``method`` (rl, opd, combine); 0 when it trains nothing."""
    score = abs(reward) if reward else 0
    hint = 1.0 if has_hint else 0.0
    if method == "rl":
        return float(score)
    if method == "opd":
        return w_opd * hint
    return w_rl * score + w_opd * hint


def _effective(cap: float, members: int) -> float:
    return max(cap, 1.0 / members) if members else 1.0


def member_weights(masses: Mapping[Hashable, float], *, cap: float,
                   past: Mapping[Hashable, float] | None = None) -> dict[Hashable, float]:
    """The weight w_m in [0, 1] of each member's samples in this batch, from their batch masses M_m and their
    weighted masses P_m over the window's previous runs (``past``), so that both caps in the module's
    docstring hold.

    The largest admissible masses x_m = w_m M_m are the fixed point of
    x_m = min(M_m, c_u X, c_w (P + X) - P_m) with X = sum x_m (c_u, c_w: the cap, or 1 / members where fewer
    members than 1 / cap are in this batch, c_w at most 1 / 2, counting for c_u only members the window
    leaves room for); iterated from x = M, X decreases towards the largest such point, where every member
    under the caps keeps all of their mass.
    """
    past = {m: p for m, p in (past or {}).items() if p > 0}
    active = {m: float(v) for m, v in masses.items() if v > 0}
    if not active:
        return {m: 1.0 for m in masses}
    # Over the window, as many members as are in this batch (at least two where the window has others: a
    # member alone in a batch may still carry at most half of the window); see the module's docstring.
    c_window = _effective(cap, max(len(active), min(2, len(set(active) | set(past)))))
    past_total = sum(past.values())
    x = dict(active)
    total = sum(x.values())
    for _ in range(ITERATIONS):
        room = {m: c_window * (past_total + total) - past.get(m, 0.0) for m in active}
        # A member the window leaves no room in this update does not count towards the per-update cap's
        # "fewer members than 1 / cap" case: the others then share this update equally at most.
        c_update = _effective(cap, sum(r > 0 for r in room.values()))
        x = {m: max(0.0, min(mass, c_update * total, room[m])) for m, mass in active.items()}
        new_total = sum(x.values())
        if abs(new_total - total) <= TOLERANCE * max(1.0, total):
            total = new_total
            break
        total = new_total
    weights = {m: 1.0 for m in masses}
    weights.update({m: min(1.0, x[m] / mass) for m, mass in active.items()})
    return weights


def median_clip_weights(masses: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """The optional robust per-member aggregation (``CLAWHUB_INFLUENCE_AGGREGATION=median_clip``): each
    member's batch mass is clipped to the median member's, w_m = min(1, median_k M_k / M_m).

    Where the cap bounds a member's share, this bounds a member's mass by what a typical member brings: one
    member supplying most of a batch pulls no harder than the median member. Members at or under the median
    keep weight 1, so with honest members of similar volume only the busiest few lose a little (measured in
    the tests on the real loss: a few percent of the update).
    """
    active = {m: float(v) for m, v in masses.items() if v > 0}
    weights = {m: 1.0 for m in masses}
    if len(active) < 2:
        return weights
    median = statistics.median(active.values())
    weights.update({m: min(1.0, median / mass) for m, mass in active.items()})
    return weights


def robust_weights(masses: Mapping[Hashable, float], *, cap: float, past: Mapping[Hashable, float] | None,
                   aggregation: str) -> dict[Hashable, float]:
    """The cap's weights (``member_weights``), lowered further by the robust aggregation when one is set; a
    weight is the smaller of the two, so each bound still holds."""
    weights = member_weights(masses, cap=cap, past=past)
    if aggregation == "median_clip":
        clip = median_clip_weights(masses)
        weights = {m: min(w, clip[m]) for m, w in weights.items()}
    elif aggregation not in ("", "none"):
        raise ValueError(f"unknown influence aggregation {aggregation!r}: none or median_clip")
    return weights


@dataclass(frozen=True)
class Claimed:
    """A claimed sample as the influence bound sees it."""

    sample_id: int
    member_id: int
    reward: int
    has_hint: bool


def window_masses(*, tenant: Tenant, window: int) -> dict[int, float]:
    """Weighted advantage mass per member over the tenant's last ``window`` trained runs."""
    if window <= 0:
        return {}
    runs = list(TrainingRun.objects.filter(tenant=tenant, state=TrainingRun.State.SUCCEEDED)
                .order_by("-created_at", "-id").values_list("pk", flat=True)[:window])
    rows = (Sample.objects.filter(tenant=tenant, training_run_id__in=runs, trained_at__isnull=False)
            .values("user_id")
            .annotate(mass=Sum(F("train_weight") * F("advantage_mass"))))
    return {r["user_id"]: float(r["mass"] or 0.0) for r in rows}


def batch_weights_set(*, tenant: Tenant, sample_ids: list[int], method: str,
                      config: Mapping) -> dict[int, float]:
    """Called in the claiming transaction of a run: records each sample's advantage mass and sets its loss
    weight (group tenants; a personal tenant has one member and every weight stays 1). Returns the weights
    per member."""
    w_rl, w_opd = float(config.get("w_rl", 1.0)), float(config.get("w_opd", 1.0))
    claimed = [Claimed(*row) for row in Sample.objects.filter(tenant=tenant, pk__in=sample_ids)
               .values_list("pk", "user_id", "reward", "has_hint")]
    mass = {c.sample_id: advantage_mass(method=method, reward=c.reward, has_hint=c.has_hint, w_rl=w_rl,
                                        w_opd=w_opd) for c in claimed}
    per_member: dict[int, float] = {}
    for c in claimed:
        per_member[c.member_id] = per_member.get(c.member_id, 0.0) + mass[c.sample_id]
    weights = {m: 1.0 for m in per_member}
    if tenant.kind == Tenant.Kind.GROUP:
        weights = robust_weights(per_member, cap=settings.CLAWHUB_INFLUENCE_CAP,
                                 past=window_masses(tenant=tenant, window=settings.CLAWHUB_INFLUENCE_WINDOW),
                                 aggregation=settings.CLAWHUB_INFLUENCE_AGGREGATION)
    Sample.objects.bulk_update(
        [Sample(pk=c.sample_id, advantage_mass=mass[c.sample_id], train_weight=weights[c.member_id])
         for c in claimed],
        ["advantage_mass", "train_weight"],
    )
    return weights
