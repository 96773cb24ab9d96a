"""Reads for review: who may review what, the console's lists and the training selector (members' influence
on a group's adapter is in clawhub.training.selectors).

Who reviews a tenant's samples is ``clawhub.tenants.access.review_access``: site staff review every tenant,
group owners and admins their group's samples, and every user their own personal tenant's (it is their
adapter; nobody else's is at stake). Members and viewers of a group see their own samples
(``clawhub.privacy.selectors.samples_for_user``), never the group's review queue. The same rule for lists is
``clawhub.tenants.access.managed_tenants``: the tenants an actor reviews.
"""

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Min, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from clawhub.accounts.models import User
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import SERVED_IDS, turn_training_source
from clawhub.core.exceptions import ValidationFailed
from clawhub.feedback.models import ExplicitFeedback, Judgment
from clawhub.feedback.selectors import explicit_feedback_for_turn
from clawhub.review import flags
from clawhub.review.consensus import PROBATION, member_standings
from clawhub.review.flags import Flag, explicit_overrides_judge
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.tenants.access import managed_tenants, review_access_by_id
from clawhub.tenants.models import Tenant
from clawhub.tenants.selectors import tenant_label  # noqa: F401  (re-exported: labels as the adapter pages)

# --- policy -------------------------------------------------------------------------------------------------


def review_policy_default_mode(tenant: Tenant) -> str:
    # Groups wait for a human on anything flagged; a person's own adapter is theirs to steer.
    return ReviewPolicy.Mode.FLAGGED if tenant.kind == Tenant.Kind.GROUP else ReviewPolicy.Mode.AUTO


def review_policy_for(*, tenant: Tenant) -> ReviewPolicy:
    """The tenant's policy, or an unsaved one with the defaults."""
    policy = ReviewPolicy.objects.filter(tenant=tenant).first()
    if policy is not None:
        return policy
    policy = ReviewPolicy(tenant=tenant, mode=review_policy_default_mode(tenant))
    if tenant.kind == Tenant.Kind.USER:
        # The new-key guard protects a shared adapter from throwaway keys. On a person's own adapter only
        # their own keys feed it, so by default a brand-new user's first feedback trains at once.
        policy.new_key_age = timedelta(0)
    return policy


# --- the review console -------------------------------------------------------------------------------------


def _samples() -> QuerySet[Sample]:
    return Sample.objects.select_related("tenant__group", "tenant__user", "user", "key", "decided_by")


def _int_or_invalid(value: Any, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationFailed(f"{field} must be an integer.", field=field) from None


def samples_for_review(
    *, actor: User, tenant_id: Any = None, flag: str = "", reward: Any = None, state: str = "",
) -> QuerySet[Sample]:
    """The samples an actor reviews (tenants.access.managed_tenants), newest first, filtered. Filtering on a
    tenant the actor does not review is refused the way opening one of its samples would be."""
    samples = _samples().filter(tenant__in=managed_tenants(actor=actor))
    if tenant_id not in (None, ""):
        access = review_access_by_id(actor=actor, tenant_id=_int_or_invalid(tenant_id, "tenant"))
        samples = samples.filter(tenant=access.tenant)
    if flag:
        if flag == "any":
            samples = samples.exclude(flags=[])
        elif flag == "none":
            samples = samples.filter(flags=[])
        elif flag in flags.CODES:
            # The code as a quoted JSON string: it can only match a value that is exactly the code (a quote
            # inside a detail is escaped). Unlike jsonb containment, this also works on the embedded SQLite.
            samples = samples.filter(flags__icontains=f'"{flag}"')
        else:
            raise ValidationFailed(f"Unknown flag {flag!r}.", field="flag",
                                   allowed=[*flags.CODES, "any", "none"])
    if reward not in (None, ""):
        samples = samples.filter(reward=_int_or_invalid(reward, "reward"))
    if state:
        if state not in Sample.State.values:
            raise ValidationFailed(f"Unknown state {state!r}.", field="state", allowed=Sample.State.values)
        samples = samples.filter(state=state)
    return samples.order_by("-created_at", "-id")


def sample_for_review(*, sample_id: int) -> Sample | None:
    """A sample by id for the console; the view checks that the actor reviews its tenant
    (tenants.access.review_access_for_row)."""
    return _samples().select_related("turn", "judgment").filter(pk=sample_id).first()


def sample_for_decision(*, sample_id: int) -> Sample | None:
    """A sample by id with its tenant, for approving or rejecting it; the view checks that the actor reviews
    its tenant (tenants.access.review_access_for_row) and the service locks it."""
    return Sample.objects.select_related("tenant").filter(pk=sample_id).first()


def sample_tenants(*, sample_ids: Iterable[int]) -> list[Tenant]:
    """The tenants of the listed samples that exist, each once, in the order of its first sample id (the order
    a bulk decision meets them in); the view resolves the caller's review access to each."""
    return list(Tenant.objects.select_related("group", "user").filter(samples__pk__in=list(sample_ids))
                .annotate(first_sample=Min("samples__pk")).order_by("first_sample"))


def reviewable_tenants(*, actor: User) -> QuerySet[Tenant]:
    """Tenants for the console's filter: those the actor reviews that have samples."""
    tenants = Tenant.objects.select_related("group", "user").filter(samples__isnull=False).distinct()
    return tenants.filter(pk__in=managed_tenants(actor=actor).values("pk")).order_by("kind", "pk")


# --- the training selector ----------------------------------------------------------------------------------


def _trainable(tenant: Tenant) -> QuerySet[Sample]:
    samples = (
        Sample.objects.filter(tenant=tenant, state=Sample.State.APPROVED, trained_at__isnull=True,
                              training_run_id__isnull=True,
                              user__is_active=True, user__training_enabled=True)
        # A sample made through a key that was deleted since keeps key NULL: the user's own switch decides.
        .filter(Q(key__isnull=True) | Q(key__training_enabled=True))
    )
    if tenant.kind == Tenant.Kind.GROUP:
        waiting = consensus_waiting(tenant=tenant)
        if waiting is not None:
            samples = samples.exclude(waiting)
    return samples


def consensus_waiting(*, tenant: Tenant) -> Q | None:
    """What of a group's approved samples the consensus guard keeps from training now
    (review.consensus.member_standings): every sample of a member on probation, and those of a member it
    finds disagreeing that no reviewer approved with the flag in view (the next run's claim holds them for
    review: review.services.consensus_holds_refresh). None when nothing waits."""
    standings = member_standings(tenant=tenant, policy=review_policy_for(tenant=tenant))
    probation = [m for m, s in standings.items() if s.state == PROBATION]
    disagreeing = [m for m, s in standings.items() if s.state == flags.DISAGREES]
    unreviewed = []
    if disagreeing:
        approved = Sample.objects.filter(tenant=tenant, user_id__in=disagreeing, state=Sample.State.APPROVED,
                                         training_run_id__isnull=True, trained_at__isnull=True)
        unreviewed = [pk for pk, found in approved.values_list("pk", "flags")
                      if flags.CONSENSUS not in {f.get("code") for f in found or []}]
    if not probation and not unreviewed:
        return None
    return Q(user_id__in=probation) | Q(pk__in=unreviewed)


def samples_for_training(
    *, tenant: Tenant, limit: int | None = None, member_cap: float | None = None
) -> list[Sample]:
    """The next training batch of a tenant: approved, unclaimed, not deleted samples, oldest first, from users
    and keys that allow training. In a group no member fills more than ceil(member_cap × limit) of the batch,
    so the batch can come out smaller than ``limit`` while one member dominates the queue, and the samples of
    members the consensus guard holds back wait (``consensus_waiting``).

    A read only: the training run claims what it takes (setting ``training_run_id``) in its own transaction,
    with ``select_for_update(skip_locked=True)`` on these ids.
    """
    limit = settings.CLAWHUB_TRAINING_BATCH_SIZE if limit is None else limit
    share = settings.CLAWHUB_REVIEW_MEMBER_CAP if member_cap is None else member_cap
    if limit <= 0:
        return []
    samples = _trainable(tenant)
    if tenant.kind == Tenant.Kind.GROUP and share < 1:
        cap = flags.member_cap(limit, share)
        # Rank each member's samples oldest first and keep the first ``cap`` of each: one query.
        samples = samples.annotate(
            member_rank=Window(RowNumber(), partition_by=[F("user_id")], order_by=[F("created_at"), F("id")])
        ).filter(member_rank__lte=cap)
    return list(samples.select_related("turn", "judgment").order_by("created_at", "id")[:limit])


def pending_review_count(*, tenant: Tenant) -> int:
    """How many of the tenant's samples wait for a reviewer's decision before they may train."""
    return Sample.objects.filter(tenant=tenant, state=Sample.State.PENDING, training_run__isnull=True).count()


def trainable_count(*, tenant: Tenant) -> int:
    """How many samples the tenant could train on now (before the per-member cap)."""
    return _trainable(tenant).count()


def training_sources_for_tenant(*, tenant_id: int) -> dict:
    """For the training page: how many of the tenant's samples train on served ids, how many on a re-render
    and why (``turn_training_source`` per sample, counted in the database)."""
    rows = (
        Sample.objects.filter(tenant_id=tenant_id)
        .annotate(
            no_prompt_ids=ExpressionWrapper(
                Q(turn__prompt_token_count__isnull=True), output_field=BooleanField()
            ),
            no_ids=ExpressionWrapper(Q(turn__token_ids__isnull=True), output_field=BooleanField()),
        )
        .values("turn__route", "no_prompt_ids", "no_ids")
        .annotate(n=Count("id"))
        .order_by()
    )
    served, why_counts = 0, dict[str, int]()
    for row in rows:
        probe = Turn(
            route=row["turn__route"],
            prompt_token_count=None if row["no_prompt_ids"] else 1,
            token_ids=None if row["no_ids"] else [0],
        )
        source, why = turn_training_source(turn=probe)
        if source == SERVED_IDS:
            served += row["n"]
        else:
            why_counts[why] = why_counts.get(why, 0) + row["n"]
    rerendered = sorted(why_counts.items(), key=lambda item: -item[1])
    return {"served": served, "rerendered": sum(why_counts.values()), "reasons": rerendered}


# --- what a sample learns from: the judge's verdict and a person's rating --------------------------------

# How a corrected reply enters the teacher's context (it is appended to the last user message as a hint, the
# way the trainer appends every hint): the teacher then reads the reply it should give, so its log-probs of
# that reply are high and the OPD advantage pulls the student towards it.
DEMONSTRATION_HINT = "The user corrected this reply. The reply they wanted:\n{demonstration}"


@dataclass(frozen=True)
class SampleSignal:
    """What a turn's sample learns from, once the judge's verdict and a person's own rating are put together.

    reward: the person's (thumb, else score) where they gave one, else the judge's; +1 for a demonstration
        (what trains then is the corrected reply, which is good by definition).
    hints: the person's comment (and corrected reply) as the only hint when they wrote one, else the judge's.
    demonstration: the corrected reply, trained instead of the served one.
    flags: poisoning-guard flags this feedback raises (the person contradicts the judge).
    """

    reward: int
    hints: list[str]
    demonstration: str = ""
    flags: list[Flag] = field(default_factory=list)

    @property
    def teaches(self) -> bool:
        return self.reward != 0 or bool(self.hints) or bool(self.demonstration)


def sample_signal(*, judgment: Judgment, explicit: ExplicitFeedback | None = None) -> SampleSignal:
    """The judge's verdict, outranked by explicit feedback where the turn has some (both stay recorded)."""
    explicit = explicit or explicit_feedback_for_turn(turn_id=judgment.turn_id)
    judged = judgment.status == Judgment.Status.OK
    judge_reward = judgment.reward if judged else 0
    judge_hints = [h for h in (judgment.hints or []) if isinstance(h, str) and h.strip()] if judged else []
    if explicit is None:
        return SampleSignal(reward=judge_reward, hints=judge_hints)
    demonstration = explicit.demonstration.strip()
    own = explicit.reward
    reward = 1 if demonstration else (own if own is not None else judge_reward)
    parts = [explicit.comment.strip()] if explicit.comment.strip() else []
    if demonstration:
        parts.append(DEMONSTRATION_HINT.format(demonstration=demonstration))
    flag = explicit_overrides_judge(judge_reward=judge_reward, explicit_reward=own)
    return SampleSignal(reward=reward, hints=["\n\n".join(parts)] if parts else judge_hints,
                        demonstration=demonstration, flags=[flag] if flag else [])


def train_sample_with_feedback(train: Any, *, judgment: Judgment) -> Any:
    """The trainer's sample of a turn (``workers.trainer.backend.TrainSample``) with explicit feedback
    applied: the hints it ranks, and for a demonstration the corrected reply as the trained response. That
    reply was never sampled, so it has no token ids or log-probs: the trainer re-renders it after the prompt
    and recomputes pi_old (``source`` says so)."""
    signal = sample_signal(judgment=judgment)
    changes: dict[str, Any] = {"hints": list(signal.hints)}
    if signal.demonstration:
        changes.update(response_text=signal.demonstration, response_token_ids=None, response_logprobs=None,
                       prompt_token_ids=None,
                       source="re-rendered: a demonstration (the user's corrected reply), pi_old recomputed")
    return dataclasses.replace(train, **changes)
