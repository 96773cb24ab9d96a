"""Reads for review: who may review what, the console's lists, users' own samples, and the training selector.

Review scope (resolved once per request by ``review_scope``):
- site staff review every tenant;
- group owners and admins review their group's samples;
- every user reviews their own personal tenant's samples (it is their adapter; nobody else's is at stake).
Members and viewers of a group see their own samples (``samples_for_user``), never the group's review queue.
"""

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from clawhub.accounts.models import AuditLog, User
from clawhub.adapters.selectors import tenant_label  # noqa: F401  (re-exported: labels as the adapter pages)
from clawhub.core.exceptions import NotFound, PermissionDenied, ValidationFailed
from clawhub.groups.models import ROLE_RANK, Group, Membership, Role
from clawhub.groups.selectors import group_members
from clawhub.keys.selectors import keys_for_user
from clawhub.review import flags
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.tenants.models import Tenant

_REVIEWER_ROLES = [role.value for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[Role.ADMIN]]


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


# --- who may review -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewScope:
    """The tenants an actor reviews: all of them (staff), or the listed ids."""

    actor: User
    all_tenants: bool
    tenant_ids: frozenset[int]

    def covers(self, tenant_id: int) -> bool:
        return self.all_tenants or tenant_id in self.tenant_ids

    def filter(self, samples: QuerySet[Sample]) -> QuerySet[Sample]:
        return samples if self.all_tenants else samples.filter(tenant_id__in=self.tenant_ids)


def review_scope(*, actor: User) -> ReviewScope:
    if actor.is_staff:
        return ReviewScope(actor=actor, all_tenants=True, tenant_ids=frozenset())
    ids = set(Tenant.objects.filter(
        Q(kind=Tenant.Kind.USER, user=actor)
        | Q(kind=Tenant.Kind.GROUP, group__memberships__user=actor,
            group__memberships__role__in=_REVIEWER_ROLES)
    ).values_list("id", flat=True))
    return ReviewScope(actor=actor, all_tenants=False, tenant_ids=frozenset(ids))


def require_review_access(*, scope: ReviewScope, tenant: Tenant) -> None:
    """PermissionDenied for members and viewers of the tenant's group (they know it exists); NotFound for
    anyone else outside the scope, so that group samples do not leak."""
    if scope.covers(tenant.pk):
        return
    if tenant.kind == Tenant.Kind.GROUP and Membership.objects.filter(
            group_id=tenant.group_id, user=scope.actor).exists():
        raise PermissionDenied("Only the group's owner and admins, and site staff, review its samples.")
    raise NotFound("No such sample.")


# --- the review console -------------------------------------------------------------------------------------


def _samples() -> QuerySet[Sample]:
    return Sample.objects.select_related("tenant__group", "tenant__user", "user", "key", "decided_by")


def _int_or_invalid(value: Any, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationFailed(f"{field} must be an integer.", field=field) from None


def samples_for_review(
    *, scope: ReviewScope, tenant_id: Any = None, flag: str = "", reward: Any = None, state: str = "",
) -> QuerySet[Sample]:
    """The samples an actor reviews, newest first, filtered. Filtering on a tenant outside the scope is
    refused the way opening one of its samples would be."""
    samples = scope.filter(_samples())
    if tenant_id not in (None, ""):
        tenant = Tenant.objects.filter(pk=_int_or_invalid(tenant_id, "tenant")).first()
        if tenant is None:
            raise NotFound("No such tenant.")
        require_review_access(scope=scope, tenant=tenant)
        samples = samples.filter(tenant=tenant)
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


def sample_get_for_review(*, scope: ReviewScope, sample_id: int) -> Sample:
    sample = _samples().select_related("turn", "judgment").filter(pk=sample_id).first()
    if sample is None:
        raise NotFound("No such sample.")
    require_review_access(scope=scope, tenant=sample.tenant)
    return sample


def reviewable_tenants(*, scope: ReviewScope) -> QuerySet[Tenant]:
    """Tenants for the console's filter: those in the scope that have samples."""
    tenants = Tenant.objects.select_related("group", "user").filter(samples__isnull=False).distinct()
    if not scope.all_tenants:
        tenants = tenants.filter(pk__in=scope.tenant_ids)
    return tenants.order_by("kind", "pk")


# --- a user's own samples -----------------------------------------------------------------------------------


def samples_for_user(*, user: User) -> QuerySet[Sample]:
    return _samples().filter(user=user).order_by("-created_at", "-id")


# --- the training selector ----------------------------------------------------------------------------------


def _trainable(tenant: Tenant) -> QuerySet[Sample]:
    return (
        Sample.objects.filter(tenant=tenant, state=Sample.State.APPROVED, trained_at__isnull=True,
                              training_run_id__isnull=True,
                              user__is_active=True, user__training_enabled=True)
        # A sample made through a key that was deleted since keeps key NULL: the user's own switch decides.
        .filter(Q(key__isnull=True) | Q(key__training_enabled=True))
    )


def samples_for_training(
    *, tenant: Tenant, limit: int | None = None, member_cap: float | None = None
) -> list[Sample]:
    """The next training batch of a tenant: approved, unclaimed, not deleted samples, oldest first, from users
    and keys that allow training. In a group no member fills more than ceil(member_cap × limit) of the batch,
    so the batch can come out smaller than ``limit`` while one member dominates the queue.

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


def trainable_count(*, tenant: Tenant) -> int:
    """How many samples the tenant could train on now (before the per-member cap)."""
    return _trainable(tenant).count()


def tenant_get_for_review(*, scope: ReviewScope, tenant_id: int) -> Tenant:
    tenant = Tenant.objects.select_related("group", "user").filter(pk=tenant_id).first()
    if tenant is None:
        raise NotFound("No such tenant.")
    require_review_access(scope=scope, tenant=tenant)
    return tenant


# --- privacy ------------------------------------------------------------------------------------------------


def _audit_row_for_export(row: AuditLog, user: User) -> dict:
    """An audit row about the user. Rows where the user acted on someone else keep only what the user did:
    the other person's name and the row's details are theirs, not this user's."""
    about_user = row.subject_user_id in (None, user.pk)
    return {
        "id": row.pk,
        "created_at": row.created_at,
        "action": row.action,
        "by": "you" if row.actor_id == user.pk else ("someone else" if row.actor_id else "system"),
        "target_type": row.target_type,
        "target_id": row.target_id,
        "target": row.target_repr if about_user else "",
        "group": row.group.slug if row.group_id else None,
        "ip": row.ip if row.actor_id == user.pk else None,
        "data": row.data if about_user else {},
    }


def user_data_export(*, user: User) -> dict[str, Any]:
    """Everything ClawHub holds about the user, as plain JSON-ready data, and nothing about anyone else:
    their profile, keys (never secrets or digests), memberships, sessions, turns, judgments, samples, usage
    and the audit rows that concern them."""
    from clawhub.conversations.models import Session, Turn
    from clawhub.feedback.models import Judgment
    from clawhub.usage.models import UsageDaily

    keys = [
        {"id": k.pk, "name": k.name, "display": k.display, "group": k.group.slug if k.group_id else None,
         "allowed_models": k.allowed_models, "rpm_limit": k.rpm_limit, "tpm_limit": k.tpm_limit,
         "concurrency_limit": k.concurrency_limit, "expires_at": k.expires_at, "revoked_at": k.revoked_at,
         "last_used_at": k.last_used_at, "created_at": k.created_at, "training_enabled": k.training_enabled}
        for k in keys_for_user(user=user)
    ]
    memberships = [
        {"group": {"id": m.group_id, "slug": m.group.slug, "name": m.group.name}, "role": m.role,
         "joined_at": m.created_at}
        for m in Membership.objects.filter(user=user).select_related("group").order_by("created_at", "pk")
    ]
    sessions = list(Session.objects.filter(user=user).order_by("started_at", "pk").values(
        "id", "tenant_id", "key_id", "external_id", "inferred", "started_at", "last_activity_at", "closed_at",
        "close_reason", "turn_count"))
    turns = list(Turn.objects.filter(user=user).order_by("created_at", "pk").values(
        "id", "session_id", "tenant_id", "key_id", "index", "turn_type", "request_id", "route", "model",
        "request", "response", "token_ids", "logprobs", "prompt_tokens", "completion_tokens", "status",
        "http_status", "latency_ms", "ttft_ms", "error", "created_at", "next_state", "next_state_at",
        "closed_without_next", "ended", "link", "parent_id", "regenerate_of_id"))
    # The messages are stored as what each turn added to its parent's: the export has every prompt whole.
    from clawhub.conversations.selectors import stored_prompts

    prompts = stored_prompts(session_ids={t["session_id"] for t in turns})
    for t in turns:
        messages = prompts.get(t["id"], (None,))[0]
        if t["route"] == "chat" and messages is not None and "messages" not in (t["request"] or {}):
            t["request"] = {**(t["request"] or {}), "messages": messages}
    judgments = list(Judgment.objects.filter(turn__user=user).order_by("created_at", "pk").values(
        "id", "turn_id", "reward", "votes", "hints", "judge", "prompt_version", "raw_outputs", "status",
        "created_at"))
    samples = list(Sample.objects.filter(user=user).order_by("created_at", "pk").values(
        "id", "turn_id", "tenant_id", "key_id", "reward", "has_hint", "state", "flags", "decided_at",
        "reason", "trained_at", "created_at"))
    from clawhub.feedback.models import ExplicitFeedback

    # Ratings the user gave (on their own turns, or as a reviewer on a group's) and ratings of their turns.
    explicit = list(ExplicitFeedback.objects.filter(Q(rated_by=user) | Q(turn__user=user)).order_by(
        "created_at", "pk").values("id", "turn_id", "tenant_id", "key_id", "source", "thumb", "score",
                                   "comment", "demonstration", "created_at", "updated_at"))
    usage = list(UsageDaily.objects.filter(user=user).order_by("day", "pk").values(
        "day", "key_id", "tenant_id", "model", "requests", "errors", "prompt_tokens", "completion_tokens",
        "latency_ms_sum", "streams"))
    audit = [
        _audit_row_for_export(row, user)
        for row in AuditLog.objects.filter(Q(actor=user) | Q(subject_user=user)).select_related("group")
        .order_by("created_at", "pk")
    ]
    return {
        "format": "clawhub-export/1",
        "profile": {
            "id": user.pk, "email": user.email, "display_name": user.display_name,
            "date_joined": user.date_joined, "last_login": user.last_login,
            "email_verified_at": user.email_verified_at, "is_staff": user.is_staff,
            "training_enabled": user.training_enabled, "store_turns": user.store_turns,
        },
        "keys": keys,
        "memberships": memberships,
        "sessions": sessions,
        "turns": turns,
        "judgments": judgments,
        "samples": samples,
        "explicit_feedback": explicit,
        "usage": usage,
        "audit": audit,
    }


@dataclass(frozen=True)
class MemberInfluence:
    """One member's weight in the group adapter: their share of the advantage mass of each of the last
    versions (oldest first; None where they had no sample in it), the smallest loss weight the influence cap
    gave their samples, and, over the review guards' window, their flagged and rejected samples."""

    user: Any
    shares: list[float | None]
    min_weight: float | None
    flagged: int
    consensus: str  # the latest consensus guard's reason for this member, or ""
    rejected: int


def group_member_influence(*, group: Group, versions: int = 5) -> tuple[list[int], list[MemberInfluence]]:
    """(the version numbers, oldest first; a row per current member) for the group page. A version's shares
    are each member's sum of loss weight x advantage mass over its run's samples, divided by the run's total
    (training.influence)."""
    from clawhub.training.models import TrainingRun

    tenant = group.tenant
    runs = list(TrainingRun.objects.filter(tenant=tenant, state=TrainingRun.State.SUCCEEDED,
                                           adapter_version__isnull=False)
                .select_related("adapter_version").order_by("-created_at", "-id")[:versions])[::-1]
    mass: dict[tuple[int, int], float] = {}
    weight: dict[int, float] = {}
    rows = (Sample.objects.filter(tenant=tenant, training_run_id__in=[r.pk for r in runs])
            .values_list("training_run_id", "user_id", "train_weight", "advantage_mass"))
    for run_id, user_id, w, m in rows:
        mass[run_id, user_id] = mass.get((run_id, user_id), 0.0) + w * m
        weight[user_id] = min(weight.get(user_id, 1.0), w)
    totals = {r.pk: sum(v for (run, _), v in mass.items() if run == r.pk) for r in runs}
    since = timezone.now() - review_policy_for(tenant=tenant).outlier_window
    recent = (Sample.objects.filter(tenant=tenant, created_at__gte=since)
              .values_list("user_id", "state", "flags"))
    flagged: dict[int, int] = {}
    rejected: dict[int, int] = {}
    consensus: dict[int, str] = {}
    for user_id, state, sample_flags in recent.order_by("created_at", "id"):
        codes = {f.get("code"): f.get("detail", "") for f in sample_flags or [] if isinstance(f, dict)}
        if codes.keys() & {flags.CONSENSUS, flags.MEMBER_OUTLIER}:
            flagged[user_id] = flagged.get(user_id, 0) + 1
        if flags.CONSENSUS in codes:
            consensus[user_id] = codes[flags.CONSENSUS]
        if state == Sample.State.REJECTED:
            rejected[user_id] = rejected.get(user_id, 0) + 1
    members = [
        MemberInfluence(
            user=m.user,
            shares=[mass[r.pk, m.user_id] / totals[r.pk] if totals[r.pk] and (r.pk, m.user_id) in mass
                    else None for r in runs],
            min_weight=weight.get(m.user_id),
            flagged=flagged.get(m.user_id, 0),
            consensus=consensus.get(m.user_id, ""),
            rejected=rejected.get(m.user_id, 0),
        )
        for m in group_members(group=group)
    ]
    return [r.adapter_version.version for r in runs], members
