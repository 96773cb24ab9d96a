"""Writes for review: samples from judgments (with the poisoning guards), a person's rating of a turn (its
explicit feedback and the sample it changes) and reviewers' decisions. A user's
control over their own data (withdrawing a sample, the switches, deleting the account) is
``clawhub.privacy.services``.

Reviewers' decisions are audited; the policy's automatic outcome is the system's own bookkeeping and is
recorded on the sample itself (state, flags) rather than in the audit log.
"""

import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record, audit_record_for_tenant
from clawhub.conversations.identity import content_text
from clawhub.conversations.models import Turn
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from clawhub.feedback.models import ExplicitFeedback, Judgment
from clawhub.feedback.selectors import explicit_feedback_for_turn
from clawhub.feedback.services import turn_lock
from clawhub.review import flags as guards
from clawhub.review.consensus import judged_recent, member_standings
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.review.selectors import review_policy_for, sample_signal
from clawhub.tenants.access import REVIEW_FORBIDDEN, TenantAccess
from clawhub.tenants.models import Tenant

BULK_MAX = 500
logger = logging.getLogger("clawhub.review")


# --- samples from judgments ---------------------------------------------------------------------------------


def next_state_text(next_state) -> str:
    """The text of a turn's next state (a list of user and tool messages)."""
    if not next_state:
        return ""
    if isinstance(next_state, dict):
        next_state = [next_state]
    return "\n".join(content_text(m.get("content")) if isinstance(m, dict) else str(m) for m in next_state)


def next_state_digest(next_state) -> str:
    text = guards.normalise_text(next_state_text(next_state))
    return hashlib.sha256(text.encode()).hexdigest() if text else ""


def _member_stats(*, tenant: Tenant, since: datetime) -> dict[int, guards.MemberStats]:
    rows = (
        Sample.objects.filter(tenant=tenant, created_at__gte=since)
        .values("user_id")
        .annotate(total=Count("id"), negative=Count("id", filter=Q(reward__lt=0)))
    )
    return {r["user_id"]: guards.MemberStats(total=r["total"], negative=r["negative"]) for r in rows}


def reply_text(turn: Turn) -> str:
    """The text of the reply the sample is about: the first choice's content, and a marker for tool calls."""
    choice = (turn.response or [{}])[0] if isinstance(turn.response, list) and turn.response else {}
    if not isinstance(choice, dict):
        return ""
    message = choice.get("message")
    if not isinstance(message, dict):
        return str(choice.get("text") or "")
    text = content_text(message.get("content"))
    if message.get("tool_calls"):
        text += '\n"tool_calls"'
    return text


def _consensus_flag(*, policy: ReviewPolicy, turn: Turn, reward: int, style: str,
                    since: datetime) -> guards.Flag | None:
    """The consensus guard over the group's judged samples in the outlier window (each member's newest, a
    bounded read: review.consensus), this one included: the author's flag, if the guard finds them
    disagreeing with the group."""
    judged = judged_recent(tenant=turn.tenant, author_id=turn.user_id, since=since)
    judged.append(guards.Judged(sample_id=None, member_id=turn.user_id, reward=reward, style=style))
    verdict = guards.group_verdicts(judged, threshold=policy.consensus_threshold,
                                    min_pairs=policy.consensus_min_pairs)[turn.user_id]
    return guards.consensus_disagreement(verdict, threshold=policy.consensus_threshold,
                                         min_pairs=policy.consensus_min_pairs)


def _flags_for(*, policy: ReviewPolicy, turn: Turn, reward: int, votes, digest: str, judged_at: datetime,
               now: datetime, style: str = "") -> list[guards.Flag]:
    """Runs every guard for a new sample; the figures come from the database, the decisions from the pure
    functions in ``review.flags``."""
    found: list[guards.Flag | None] = []
    key = turn.key
    if key is not None:
        found.append(guards.new_key(key_created_at=key.created_at, at=turn.created_at,
                                    min_age=policy.new_key_age))
        found.append(guards.revoked_key(key_revoked_at=key.revoked_at, at=judged_at))
    if digest:
        previous = Sample.objects.filter(user_id=turn.user_id, next_state_digest=digest,
                                         created_at__gte=now - policy.dup_window).count()
        found.append(guards.near_duplicate(previous=previous, threshold=policy.dup_threshold))
    found.append(guards.split_votes(votes))
    if turn.tenant.kind == Tenant.Kind.GROUP:
        stats = _member_stats(tenant=turn.tenant, since=now - policy.outlier_window)
        mine = stats.pop(turn.user_id, guards.MemberStats(0, 0))
        mine = guards.MemberStats(total=mine.total + 1, negative=mine.negative + (1 if reward < 0 else 0))
        found.append(guards.member_outlier(
            mine, list(stats.values()), rate_diff=policy.outlier_rate_diff,
            min_samples=policy.outlier_min_samples, volume_factor=policy.outlier_volume_factor,
        ))
        if style:
            found.append(_consensus_flag(policy=policy, turn=turn, reward=reward, style=style,
                                         since=now - policy.outlier_window))
    return [f for f in found if f is not None]


def sample_create_for_judgment(*, judgment_id: int) -> Sample | None:
    """Turns a stored judgment into a sample under the tenant's review policy; None when there is nothing to
    learn (reward 0 and no hint), the turn is neither a main turn nor a rated playground turn, the judgment
    failed, or the user or key has training switched off. Idempotent: a judgment delivered twice gives one
    sample.

    Called by the judge task after it stores each judgment.
    """
    existing = Sample.objects.filter(judgment_id=judgment_id).first()
    if existing is not None:
        return existing
    judgment = (Judgment.objects.select_related("turn__user", "turn__key", "turn__tenant")
                .filter(pk=judgment_id).first())
    if judgment is None:
        return None
    turn = judgment.turn
    # The judge's verdict, outranked by the person's own rating where the turn has one.
    signal = sample_signal(judgment=judgment)
    if judgment.status == judgment.Status.FAILED or not signal.teaches:
        return None
    # A playground turn is never judged; it becomes a sample only once its user rated it.
    rated_playground = (turn.turn_type == Turn.Type.PLAYGROUND
                        and explicit_feedback_for_turn(turn_id=turn.pk) is not None)
    if (turn.turn_type != Turn.Type.MAIN and not rated_playground) or not turn.user.training_enabled:
        return None
    if turn.key is not None and not turn.key.training_enabled:
        return None
    now = timezone.now()
    policy = review_policy_for(tenant=turn.tenant)
    digest = next_state_digest(turn.next_state)
    style = guards.reply_style(reply_text(turn))
    found = _flags_for(policy=policy, turn=turn, reward=signal.reward, votes=judgment.votes, digest=digest,
                       judged_at=getattr(judgment, "created_at", None) or now, now=now,
                       style=style) + signal.flags
    sample = Sample(
        turn=turn, judgment=judgment, tenant=turn.tenant, user=turn.user, key=turn.key,
        reward=signal.reward, has_hint=bool(signal.hints), state=guards.initial_state(policy.mode, found),
        flags=[f.as_json() for f in found], next_state_digest=digest, reply_style=style, created_at=now,
    )
    try:
        with transaction.atomic():
            sample.save()
    except IntegrityError:
        # A concurrent delivery of the same judgment got there first.
        return Sample.objects.get(judgment_id=judgment_id)
    consensus = next((f for f in found if f.code == guards.CONSENSUS), None)
    if consensus is not None:
        samples_hold_for_consensus(tenant=turn.tenant, user_id=turn.user_id, flag=consensus)
    return sample


def samples_hold_for_consensus(*, tenant: Tenant, user_id: int, flag: guards.Flag) -> int:
    """A member the consensus guard flagged: their approved samples that no run has claimed go back to pending
    with the flag, so none of them trains before a reviewer has looked at it in that light. Those approved
    already carrying the flag stay approved: a reviewer saw it and decided. Those a reviewer approved for
    another reason (a new key's) are held too, and their earlier decision is cleared (the audit log keeps
    it). Returns how many were held."""
    held = 0
    with transaction.atomic():
        waiting = Sample.objects.select_for_update(skip_locked=True).filter(
            tenant=tenant, user_id=user_id, state=Sample.State.APPROVED, training_run_id__isnull=True,
            trained_at__isnull=True)
        for sample in waiting:
            if guards.CONSENSUS in sample.flag_codes:
                continue
            sample.flags = [*(sample.flags or []), flag.as_json()]
            sample.state, sample.reason = Sample.State.PENDING, ""
            sample.decided_by, sample.decided_at = None, None
            sample.save(update_fields=["flags", "state", "decided_by", "decided_at", "reason"])
            held += 1
    if held:
        logger.info("consensus guard: %d approved samples of user %s in tenant %s back to review",
                    held, user_id, tenant.pk)
    return held


def consensus_holds_refresh(*, tenant: Tenant) -> int:
    """Called before a group's batch is claimed: the guard runs again for every member (the others' samples
    since a member's last one can tip their verdict), and each member it now finds disagreeing has their
    approved samples held as at creation (``samples_hold_for_consensus``). Returns how many were held."""
    standings = member_standings(tenant=tenant, policy=review_policy_for(tenant=tenant))
    return sum(samples_hold_for_consensus(tenant=tenant, user_id=user_id, flag=standing.flag)
               for user_id, standing in standings.items() if standing.flag is not None)


# --- a person's rating of a turn ----------------------------------------------------------------------------

COMMENT_MAX = 4000
DEMONSTRATION_MAX = 32000
_UNSET: Any = object()


def _clean_feedback(*, thumb: Any, score: Any, comment: Any, demonstration: Any) -> dict[str, Any]:
    """The fields the caller gave, checked; ``_UNSET`` ones are left out (they keep their stored value)."""
    fields: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    if thumb is not _UNSET:
        if thumb in (None, ""):
            fields["thumb"] = ""
        elif thumb in ExplicitFeedback.Thumb.values:
            fields["thumb"] = thumb
        else:
            errors["thumb"] = ['"up", "down" or null.']
    if score is not _UNSET:
        if score is None:
            fields["score"] = None
        elif isinstance(score, int) and not isinstance(score, bool) and 1 <= score <= 5:
            fields["score"] = score
        else:
            errors["score"] = ["An integer from 1 to 5, or null."]
    for name, value, limit in (("comment", comment, COMMENT_MAX),
                               ("demonstration", demonstration, DEMONSTRATION_MAX)):
        if value is _UNSET:
            continue
        if value is None:
            value = ""
        if not isinstance(value, str):
            errors[name] = ["A string."]
        elif len(value) > limit:
            errors[name] = [f"At most {limit} characters."]
        else:
            fields[name] = value.strip()
    if errors:
        raise ValidationFailed("The feedback is not valid.", fields=errors)
    return fields


def _sample_follow_feedback(*, sample, judgment: Judgment, feedback: ExplicitFeedback) -> None:
    """Brings an existing, unclaimed sample in line with the judge's verdict and the person's rating. An
    approved sample is decided again by the tenant's policy (a rating against the judge waits for a human);
    a pending one keeps waiting; a rejected or deleted one keeps its state, with the new reward on record."""
    signal = sample_signal(judgment=judgment, explicit=feedback)
    flags = [f for f in sample.flags or [] if f.get("code") != guards.EXPLICIT_OVERRIDES_JUDGE]
    flags += [f.as_json() for f in signal.flags]
    state = sample.state
    if state == Sample.State.APPROVED:
        state = guards.initial_state(review_policy_for(tenant=sample.tenant).mode, flags)
    if (sample.reward, sample.has_hint, sample.flags, sample.state) == (signal.reward, bool(signal.hints),
                                                                         flags, state):
        return
    if state != sample.state:
        sample.decided_by, sample.decided_at, sample.reason = None, None, ""
    sample.reward, sample.has_hint = signal.reward, bool(signal.hints)
    sample.flags, sample.state = flags, state
    sample.save(update_fields=["reward", "has_hint", "flags", "state", "decided_by", "decided_at", "reason"])


def sample_follow_judge(*, judgment_id: int) -> None:
    """A person rated the turn before the judge ran, so its sample exists already: the judge's reward and
    hints, just stored, now count wherever the person's rating leaves them open. Nothing to do otherwise."""
    sample = Sample.objects.select_for_update().filter(judgment_id=judgment_id).first()
    if sample is None or sample.claimed:
        return
    feedback = ExplicitFeedback.objects.filter(turn_id=sample.turn_id).first()
    if feedback is not None:
        judgment = Judgment.objects.get(pk=judgment_id)
        _sample_follow_feedback(sample=sample, judgment=judgment, feedback=feedback)


def feedback_submit(
    *,
    actor: User,
    turn: Turn,
    source: str,
    key_id: int | None = None,
    thumb: Any = _UNSET,
    score: Any = _UNSET,
    comment: Any = _UNSET,
    demonstration: Any = _UNSET,
    ip: str | None = None,
) -> tuple[ExplicitFeedback, bool]:
    """Records what ``actor`` says about ``turn`` (checked by ``feedback.selectors.turn_for_rating``) and
    hands it to review: the turn's sample is created, or updated, from it. Rating a turn again updates its
    feedback (fields left out keep their value; null clears one). Returns the feedback and whether it was
    new. A turn that has gone to training can no longer be rated differently (its run trains what it
    claimed)."""
    if turn.turn_type == Turn.Type.SIDE:  # a playground turn may be rated: that is what trains on it
        raise ValidationFailed("Side turns (heartbeats, memory flushes) are never trained on; rate a main "
                               "turn.", code="side_turn")
    if source not in ExplicitFeedback.Source.values:
        raise ValidationFailed(f"Unknown source {source!r}.", field="source")
    fields = _clean_feedback(thumb=thumb, score=score, comment=comment, demonstration=demonstration)
    now = timezone.now()
    with transaction.atomic():
        judgment = turn_lock(turn=turn)
        sample = Sample.objects.select_for_update().filter(turn=turn).first()
        if sample is not None and sample.claimed:
            raise Conflict(f"This turn has already gone to training (run {sample.training_run_id}); its "
                           "feedback can no longer change.", code="sample_trained", sample=sample.pk)
        feedback = ExplicitFeedback.objects.filter(turn=turn).first()
        created = feedback is None
        feedback = feedback or ExplicitFeedback(turn=turn, tenant_id=turn.tenant_id, created_at=now)
        before = _feedback_dict(feedback) if not created else None
        for name, value in fields.items():
            setattr(feedback, name, value)
        if not (feedback.thumb or feedback.score is not None or feedback.comment or feedback.demonstration):
            raise ValidationFailed("Say something: a thumb, a score, a comment or a corrected reply.",
                                   code="empty_feedback")
        if _disagree(feedback.thumb, feedback.score):
            where = f"Thumb {feedback.thumb} with score {feedback.score}."
            if _disagree(fields.get("thumb"), fields.get("score")):  # the request itself (its schema says so)
                raise ValidationFailed("The thumb and the score disagree.", code="contradictory_feedback",
                                       fields={"score": [where]})
            # With what the turn's feedback already says: the request alone was fine.
            raise Conflict(f"The thumb and the score would disagree with the feedback stored: {where}",
                           code="contradictory_feedback")
        feedback.rated_by, feedback.key_id, feedback.source, feedback.updated_at = actor, key_id, source, now
        feedback.save()
        if judgment is None:
            judgment = Judgment.objects.create(turn=turn, tenant_id=turn.tenant_id, judge="",
                                               status=Judgment.Status.AWAITING)
        if sample is None:
            sample_create_for_judgment(judgment_id=judgment.pk)
        else:
            _sample_follow_feedback(sample=sample, judgment=judgment, feedback=feedback)
        audit_record_for_tenant(actor=actor, action="feedback.rate", target=feedback, tenant=turn.tenant,
                                ip=ip, before=before, after=_feedback_dict(feedback), source=source,
                                turn=turn.pk)
    return feedback, created


def _disagree(thumb: str | None, score: int | None) -> bool:
    """A thumb up with a score of 1-2, or down with 4-5 (3, or either missing, agrees with anything)."""
    if not thumb or score in (None, 3):
        return False
    return (thumb == ExplicitFeedback.Thumb.UP) != (score > 3)


def _feedback_dict(feedback: ExplicitFeedback) -> dict[str, Any]:
    return {"thumb": feedback.thumb, "score": feedback.score, "comment": feedback.comment[:200],
            "demonstration": len(feedback.demonstration)}


# --- reviewers' decisions -----------------------------------------------------------------------------------


_ACTIONS = {"approve": Sample.State.APPROVED, "reject": Sample.State.REJECTED}


def _decide(*, accesses: Mapping[int, TenantAccess], sample_ids: Sequence[int], action: str, reason: str,
            ip: str | None, bulk: bool) -> list[Sample]:
    if action not in _ACTIONS:
        raise ValidationFailed(f"Unknown action {action!r}.", field="action", allowed=list(_ACTIONS))
    state = _ACTIONS[action]
    reason = (reason or "").strip()
    if state == Sample.State.REJECTED and not reason:
        raise ValidationFailed("Say why the sample is rejected.", field="reason",
                               fields={"reason": ["A reason is required to reject."]})
    # Locked in id order, so concurrent bulk decisions over overlapping ids take turns instead of deadlocking.
    samples = list(
        Sample.objects.select_for_update(of=("self",)).select_related("tenant", "user")
        .filter(pk__in=sample_ids).order_by("pk")
    )
    missing = sorted(set(sample_ids) - {s.pk for s in samples})
    if missing:
        raise NotFound("No such sample." if len(missing) == 1 else "Some samples do not exist.", ids=missing)
    decided_by: dict[int, User] = {}
    for sample in samples:
        access = accesses.get(sample.tenant_id)
        if access is None:  # a tenant the view did not resolve: as if the sample did not exist
            raise NotFound("No such sample.")
        access.require_manage(message=REVIEW_FORBIDDEN)
        if state == Sample.State.APPROVED and sample.user_id == access.actor.pk and sample.tenant.group_id:
            # A group admin's own feedback trains everyone's adapter: the poisoning guards flagged it, so
            # another admin (or site staff) decides. On a personal adapter there is nobody else to ask.
            raise PermissionDenied(
                f"Sample {sample.pk} is your own: another admin of the group, or site staff, must approve "
                "it.",
                code="self_approval", id=sample.pk)
        decided_by[sample.pk] = access.actor
    for sample in samples:
        if sample.state == Sample.State.DELETED:
            raise Conflict(f"Sample {sample.pk} was deleted by its user.", code="sample_deleted",
                           id=sample.pk)
        if sample.claimed and sample.state != state:
            raise Conflict(f"Sample {sample.pk} has already gone to training.", code="sample_trained",
                           id=sample.pk)
    now = timezone.now()
    for sample in samples:
        if sample.state == state and sample.reason == reason:
            continue
        previous, actor = sample.state, decided_by[sample.pk]
        sample.state, sample.reason, sample.decided_by, sample.decided_at = state, reason, actor, now
        sample.save(update_fields=["state", "reason", "decided_by", "decided_at"])
        audit_record(actor=actor, action=f"sample.{action}", target=sample, subject_user=sample.user,
                     group=sample.tenant.group if sample.tenant.group_id else None, ip=ip,
                     previous_state=previous, reason=reason, flags=sample.flag_codes, reward=sample.reward,
                     bulk=bulk)
    return samples


@transaction.atomic
def sample_approve(*, access: TenantAccess, sample_id: int, reason: str = "",
                   ip: str | None = None) -> Sample:
    """Approves a sample of ``access.tenant`` (``access`` from review_access: the view resolves it). Nobody
    approves their own sample of a group."""
    return _decide(accesses={access.tenant.pk: access}, sample_ids=[sample_id], action="approve",
                   reason=reason, ip=ip, bulk=False)[0]


@transaction.atomic
def sample_reject(*, access: TenantAccess, sample_id: int, reason: str, ip: str | None = None) -> Sample:
    """Rejects a sample of ``access.tenant`` (``access`` from review_access), saying why."""
    return _decide(accesses={access.tenant.pk: access}, sample_ids=[sample_id], action="reject",
                   reason=reason, ip=ip, bulk=False)[0]


@transaction.atomic
def samples_bulk_decide(*, accesses: Mapping[int, TenantAccess], sample_ids: Iterable[int], action: str,
                        reason: str = "", ip: str | None = None) -> list[Sample]:
    """Approves or rejects every listed sample, or none of them: one sample the actor may not review, or
    that cannot change, fails the whole request. ``accesses`` is the actor's review access to the samples'
    tenants, by tenant id (tenants.access.review_access_for_tenants, resolved by the view)."""
    ids = sorted({int(i) for i in sample_ids})
    if not ids:
        raise ValidationFailed("Choose at least one sample.", field="ids")
    if len(ids) > BULK_MAX:
        raise ValidationFailed(f"At most {BULK_MAX} samples at a time.", field="ids")
    return _decide(accesses=accesses, sample_ids=ids, action=action, reason=reason, ip=ip, bulk=True)


@transaction.atomic
def review_policy_set(*, access: TenantAccess, mode: str, ip: str | None = None) -> ReviewPolicy:
    """Changes a tenant's review mode; for those who review the tenant (``access`` from review_access)."""
    access.require_manage(message=REVIEW_FORBIDDEN)
    tenant, actor = access.tenant, access.actor
    if mode not in ReviewPolicy.Mode.values:
        raise ValidationFailed(f"Unknown review mode {mode!r}.", field="mode",
                               allowed=ReviewPolicy.Mode.values)
    policy = review_policy_for(tenant=tenant)
    old = policy.mode if policy.pk else None
    if old != mode:
        policy.mode = mode
        policy.save()
        audit_record(actor=actor, action="review.policy", target=policy, subject_user=tenant.user,
                     group=tenant.group, ip=ip, old_mode=old, mode=mode)
    return policy
