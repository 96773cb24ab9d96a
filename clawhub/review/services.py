"""Writes for review: samples from judgments (with the poisoning guards), reviewers' decisions, and users'
control over their own data (deleting samples, training and storage switches, deleting the account).

Reviewers' decisions and users' changes are audited; the policy's automatic outcome is the system's own
bookkeeping and is recorded on the sample itself (state, flags) rather than in the audit log.
"""

import hashlib
import logging
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from clawhub.accounts.models import AuditLog, User
from clawhub.accounts.services import audit_record
from clawhub.conversations.identity import content_text
from clawhub.conversations.models import Turn
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from clawhub.groups.models import Group, Membership, Role
from clawhub.keys.models import ApiKey
from clawhub.review import flags as guards
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.review.selectors import require_review_access, review_policy_for, review_scope
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
    """The consensus guard over the group's judged samples in the outlier window, this one included."""
    rows = (Sample.objects.filter(tenant=turn.tenant, created_at__gte=since).exclude(reply_style="")
            .exclude(state=Sample.State.DELETED).values_list("pk", "user_id", "reward", "reply_style"))
    judged = [guards.Judged(sample_id=pk, member_id=user, reward=r, style=st) for pk, user, r, st in rows]
    judged.append(guards.Judged(sample_id=None, member_id=turn.user_id, reward=reward, style=style))
    return guards.consensus_disagreement(
        guards.consensus_of(turn.user_id, judged), threshold=policy.consensus_threshold,
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
    learn (reward 0 and no hint), the turn is not a main turn, the judgment failed, or the user or key has
    training switched off. Idempotent: a judgment delivered twice gives one sample.

    Called by the judge task after it stores each judgment.
    """
    from clawhub.feedback.models import Judgment
    from clawhub.feedback.selectors import sample_signal

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
    if turn.turn_type != Turn.Type.MAIN or not turn.user.training_enabled:
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
    """A member the consensus guard flagged: their samples that the policy approved on its own (no human
    decided) and that no run has claimed go back to pending with the flag, so none of them trains before a
    reviewer has looked. Returns how many were held."""
    held = 0
    with transaction.atomic():
        waiting = Sample.objects.select_for_update(skip_locked=True).filter(
            tenant=tenant, user_id=user_id, state=Sample.State.APPROVED, decided_by__isnull=True,
            training_run_id__isnull=True, trained_at__isnull=True)
        for sample in waiting:
            if guards.CONSENSUS not in sample.flag_codes:
                sample.flags = [*(sample.flags or []), flag.as_json()]
            sample.state = Sample.State.PENDING
            sample.save(update_fields=["flags", "state"])
            held += 1
    if held:
        logger.info("consensus guard: %d approved samples of user %s in tenant %s back to review",
                    held, user_id, tenant.pk)
    return held


# --- reviewers' decisions -----------------------------------------------------------------------------------


_ACTIONS = {"approve": Sample.State.APPROVED, "reject": Sample.State.REJECTED}


def _decide(*, actor: User, sample_ids: Sequence[int], action: str, reason: str, ip: str | None,
            bulk: bool) -> list[Sample]:
    if action not in _ACTIONS:
        raise ValidationFailed(f"Unknown action {action!r}.", field="action", allowed=list(_ACTIONS))
    state = _ACTIONS[action]
    reason = (reason or "").strip()
    if state == Sample.State.REJECTED and not reason:
        raise ValidationFailed("Say why the sample is rejected.", field="reason",
                               fields={"reason": ["A reason is required to reject."]})
    scope = review_scope(actor=actor)
    # Locked in id order, so concurrent bulk decisions over overlapping ids take turns instead of deadlocking.
    samples = list(
        Sample.objects.select_for_update(of=("self",)).select_related("tenant", "user")
        .filter(pk__in=sample_ids).order_by("pk")
    )
    missing = sorted(set(sample_ids) - {s.pk for s in samples})
    if missing:
        raise NotFound("No such sample." if len(missing) == 1 else "Some samples do not exist.", ids=missing)
    for sample in samples:
        require_review_access(scope=scope, tenant=sample.tenant)
        if state == Sample.State.APPROVED and sample.user_id == actor.pk and sample.tenant.group_id:
            # A group admin's own feedback trains everyone's adapter: the poisoning guards flagged it, so
            # another admin (or site staff) decides. On a personal adapter there is nobody else to ask.
            raise PermissionDenied(
                f"Sample {sample.pk} is your own: another admin of the group, or site staff, must approve "
                "it.",
                code="self_approval", id=sample.pk)
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
        previous = sample.state
        sample.state, sample.reason, sample.decided_by, sample.decided_at = state, reason, actor, now
        sample.save(update_fields=["state", "reason", "decided_by", "decided_at"])
        audit_record(actor=actor, action=f"sample.{action}", target=sample, subject_user=sample.user,
                     group=sample.tenant.group if sample.tenant.group_id else None, ip=ip,
                     previous_state=previous, reason=reason, flags=sample.flag_codes, reward=sample.reward,
                     bulk=bulk)
    return samples


@transaction.atomic
def sample_approve(*, actor: User, sample_id: int, reason: str = "", ip: str | None = None) -> Sample:
    return _decide(actor=actor, sample_ids=[sample_id], action="approve", reason=reason, ip=ip, bulk=False)[0]


@transaction.atomic
def sample_reject(*, actor: User, sample_id: int, reason: str, ip: str | None = None) -> Sample:
    return _decide(actor=actor, sample_ids=[sample_id], action="reject", reason=reason, ip=ip, bulk=False)[0]


@transaction.atomic
def samples_bulk_decide(*, actor: User, sample_ids: Iterable[int], action: str, reason: str = "",
                        ip: str | None = None) -> list[Sample]:
    """Approves or rejects every listed sample, or none of them: one sample the actor may not review, or
    that cannot change, fails the whole request."""
    ids = sorted({int(i) for i in sample_ids})
    if not ids:
        raise ValidationFailed("Choose at least one sample.", field="ids")
    if len(ids) > BULK_MAX:
        raise ValidationFailed(f"At most {BULK_MAX} samples at a time.", field="ids")
    return _decide(actor=actor, sample_ids=ids, action=action, reason=reason, ip=ip, bulk=True)


@transaction.atomic
def review_policy_set(*, actor: User, tenant: Tenant, mode: str, ip: str | None = None) -> ReviewPolicy:
    """Changes a tenant's review mode; for those who review the tenant."""
    require_review_access(scope=review_scope(actor=actor), tenant=tenant)
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


# --- users' own data ----------------------------------------------------------------------------------------


@transaction.atomic
def sample_delete_own(*, actor: User, sample_id: int, ip: str | None = None) -> Sample:
    """The user withdraws one of their samples: it is never offered for training again. The turn stays
    (the user still sees their conversation); a sample already trained on stays in that adapter version."""
    sample = (Sample.objects.select_for_update(of=("self",)).select_related("tenant")
              .filter(pk=sample_id, user=actor).first())
    if sample is None:
        raise NotFound("No such sample.")
    if sample.state != Sample.State.DELETED:
        previous = sample.state
        sample.state = Sample.State.DELETED
        sample.save(update_fields=["state"])
        audit_record(actor=actor, action="sample.delete", target=sample, subject_user=actor,
                     group=sample.tenant.group if sample.tenant.group_id else None, ip=ip,
                     previous_state=previous)
    return sample


@transaction.atomic
def privacy_update(*, actor: User, training_enabled: bool | None = None, store_turns: bool | None = None,
                   ip: str | None = None) -> User:
    """The user's own switches: train on my data at all, and store my turns at all. Turning storage off
    also stops training (nothing stored, nothing to learn from); capture reads both through
    ``clawhub.conversations.privacy.capture_allowed``."""
    user = User.objects.select_for_update().get(pk=actor.pk)
    changes = {}
    for field, value in (("training_enabled", training_enabled), ("store_turns", store_turns)):
        if value is not None and getattr(user, field) != bool(value):
            changes[field] = {"old": getattr(user, field), "new": bool(value)}
            setattr(user, field, bool(value))
    if changes:
        user.save(update_fields=list(changes))
        audit_record(actor=actor, action="user.privacy", target=user, subject_user=user, ip=ip, **changes)
    actor.training_enabled, actor.store_turns = user.training_enabled, user.store_turns
    return user


@transaction.atomic
def key_training_set(*, actor: User, key_id: int, training_enabled: bool, ip: str | None = None) -> ApiKey:
    """Switches training on or off for what one of the actor's own keys sends."""
    key = ApiKey.objects.select_for_update().filter(pk=key_id, owner=actor).first()
    if key is None:
        raise NotFound("No such key.")
    if key.training_enabled != bool(training_enabled):
        key.training_enabled = bool(training_enabled)
        key.save(update_fields=["training_enabled"])
        audit_record(actor=actor, action="key.training", target=key, subject_user=actor, group=key.group,
                     ip=ip, training_enabled=key.training_enabled)
    return key


@transaction.atomic
def account_delete(*, actor: User, password: str, ip: str | None = None) -> "DeletionReport":
    """The user deletes their own account (``user_delete``), after typing their password again."""
    user = User.objects.select_for_update().get(pk=actor.pk)
    if not password or not user.check_password(password):
        raise PermissionDenied("The password is wrong.", code="wrong_password", field="password",
                               fields={"password": ["The password is wrong."]})
    return user_delete(user=user, actor=user, ip=ip)


@dataclass
class DeletionReport:
    """What a deletion removed beyond the rows, and what stays (said on the page and in the API)."""

    adapters_unloaded: list[str] = dataclass_field(default_factory=list)
    paths_removed: list[str] = dataclass_field(default_factory=list)
    # Shared adapters of groups the user was in but did not own alone: trained partly on their samples, and
    # kept, because they are the other members' too. Their samples in those groups are deleted.
    groups_kept: list[str] = dataclass_field(default_factory=list)


@transaction.atomic
def user_delete(*, user: User, actor: User | None, ip: str | None = None) -> DeletionReport:
    """Deletes an account and everything that is theirs: keys (revoked first so that gateways drop them at
    once), personal tenant with its adapter versions, their weights on disk, the training workdirs and the
    adapters loaded on the upstreams; sessions, turns, judgments and samples (also those in group tenants),
    usage and memberships. Groups they own alone go the same way; a group they own with other members must
    be handed over first, whoever deletes them (the user, or staff in Django admin). Audit rows stay, for the
    groups and the site, with the user's own name scrubbed by id.
    """
    from clawhub.groups.services import group_delete
    from clawhub.keys.services import key_revoke

    user = User.objects.select_for_update().get(pk=user.pk)
    owned = list(Group.objects.filter(memberships__user=user, memberships__role=Role.OWNER))
    shared = [g for g in owned if Membership.objects.filter(group=g).exclude(user=user).exists()]
    if shared:
        raise Conflict(
            "The account owns groups with other members: transfer their ownership before deleting it.",
            code="owner_must_transfer", groups=[g.slug for g in shared],
        )
    report = DeletionReport(groups_kept=sorted(
        Group.objects.filter(memberships__user=user).exclude(pk__in=[g.pk for g in owned])
        .values_list("slug", flat=True)))
    tenants = [user.tenant, *(g.tenant for g in owned)]
    leftovers = _tenant_leftovers(tenants=tenants)
    for group in owned:
        group_delete(actor=user, group=group, ip=ip)
    for key in ApiKey.objects.filter(owner=user, revoked_at__isnull=True).select_related("owner", "group"):
        key_revoke(key=key, actor=actor or user, ip=ip, reason="account deleted")
    email, pk = user.email, user.pk
    # The user's name lives on in audit rows' snapshots; the actions stay, the person does not. Only the rows
    # whose target is this user, by id: a substring of the email would also hit ann@ inside joann@.
    AuditLog.objects.filter(target_type="user", target_id=str(pk)).update(target_repr="(deleted user)")
    for row in AuditLog.objects.filter(data__email=email):
        row.data = {**row.data, "email": ""}
        row.save(update_fields=["data"])
    user.delete()
    audit_record(actor=actor if actor is not None and actor.pk != pk else None, action="user.delete",
                 target=None, ip=ip, user_id=pk, adapters=len(leftovers[0]), groups_kept=report.groups_kept)
    # Files and loaded adapters go once the rows are gone for good: a rolled-back deletion keeps them.
    transaction.on_commit(lambda: _remove_leftovers(*leftovers, report=report))
    return report


def deletion_summary(report: DeletionReport) -> str:
    """What the user is told once their account is gone: what went, and honestly what stays."""
    text = ("Your account and all your data have been deleted: keys, conversations, samples, usage, your "
            "personal adapter (its weights and training files included) and the groups you owned alone.")
    if report.groups_kept:
        text += (" The shared adapters of " + ", ".join(report.groups_kept) + " stay with their other "
                 "members; they were trained partly on your samples, which are deleted.")
    return text


def _tenant_leftovers(*, tenants: list[Tenant]) -> tuple[list[str], list[Path]]:
    """The upstream names of every adapter version of these tenants, and the folders that hold their weights
    and training state (each version's artifact, the tenant's adapter folder, each run's workdir)."""
    from clawhub.adapters.models import AdapterVersion
    from clawhub.adapters.services import artifact_dir
    from clawhub.training.models import TrainingRun

    versions = list(AdapterVersion.objects.filter(tenant__in=tenants))
    paths = [Path(v.artifact_path) for v in versions if v.artifact_path]
    paths += [artifact_dir(tenant_id=t.pk, version=0).parent for t in tenants]
    paths += [Path(w) for w in TrainingRun.objects.filter(tenant__in=tenants).exclude(workdir="")
              .values_list("workdir", flat=True)]
    return [v.upstream_name for v in versions], paths


def _inside_data_dirs(path: Path) -> bool:
    # Only what ClawHub wrote: an artifact_path pointing anywhere else (a shared model folder) is left alone.
    roots = [Path(settings.CLAWHUB_ADAPTER_DIR).resolve(), Path(settings.CLAWHUB_TRAIN_WORKDIR).resolve()]
    resolved = path.resolve()
    return any(resolved != root and resolved.is_relative_to(root) for root in roots)


def _remove_leftovers(names: list[str], paths: list[Path], *, report: DeletionReport) -> None:
    from clawhub.adapters import serving

    upstreams = serving.configured_upstreams()
    for name in names:
        if all(serving.unload_adapter(up, name=name) for up in upstreams):
            report.adapters_unloaded.append(name)
        else:
            logger.warning("account deletion: adapter %s may still be loaded on an upstream", name)
    for path in paths:
        if not path.exists():
            continue
        if not _inside_data_dirs(path):
            logger.warning("account deletion: %s is outside the adapter and training folders; left", path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            report.paths_removed.append(str(path))
