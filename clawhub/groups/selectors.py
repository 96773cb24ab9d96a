"""Reads for groups, memberships and invitations."""

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db.models import Case, F, IntegerField, QuerySet, Value, When
from django.utils import timezone

from clawhub.core.exceptions import NotFound
from clawhub.groups.models import ROLE_RANK, Group, Invitation, Membership, Role


def invitation_token_digest(token: str) -> str:
    # Tokens are 256 random bits, so a fast hash is enough; the digest is what the database holds.
    return hashlib.sha256(token.encode()).hexdigest()


def membership_get(*, group: Group, user) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(group=group, user=user).first()


def role_of(*, group: Group, user) -> Role | None:
    membership = membership_get(group=group, user=user)
    return Role(membership.role) if membership else None


def has_role(*, group: Group, user, at_least: Role) -> bool:
    role = role_of(group=group, user=user)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[at_least]


def group_get_for_member(*, slug: str, user) -> tuple[Group, Role]:
    """The group and the user's role in it. Non-members get 404 so that group names do not leak."""
    membership = (
        Membership.objects.select_related("group").filter(group__slug=slug, user=user).first()
        if user.is_authenticated else None
    )
    if membership is None:
        raise NotFound("No such group.")
    return membership.group, Role(membership.role)


def groups_for_user(*, user, at_least: Role | None = None) -> QuerySet[Group]:
    """The user's groups (those where their role is ``at_least`` or stronger, if given), each annotated with
    ``my_role``, the user's role in it."""
    conditions = {"memberships__user": user}
    if at_least is not None:
        conditions["memberships__role__in"] = [
            role.value for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[at_least]
        ]
    # One filter() call, so the role condition and the annotation share one join: the user's own membership.
    return Group.objects.filter(**conditions).annotate(my_role=F("memberships__role")).order_by("name", "pk")


def group_members(*, group: Group) -> QuerySet[Membership]:
    """Memberships of a group, strongest role first (owner at the top), then by join date."""
    rank = Case(*[When(role=role.value, then=Value(r)) for role, r in ROLE_RANK.items()],
                output_field=IntegerField())
    return (
        Membership.objects.filter(group=group)
        .select_related("user")
        .annotate(rank=rank)
        .order_by("-rank", "created_at", "pk")
    )


def group_member_get(*, group: Group, user_id: int) -> Membership:
    membership = Membership.objects.select_related("user").filter(group=group, user_id=user_id).first()
    if membership is None:
        raise NotFound("No such member.")
    return membership


def group_invitations(*, group: Group, open_only: bool = True) -> QuerySet[Invitation]:
    invitations = (
        Invitation.objects.filter(group=group).select_related("invited_by").order_by("-created_at", "-pk")
    )
    if open_only:
        invitations = invitations.filter(
            accepted_at__isnull=True, declined_at__isnull=True, revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
    return invitations


def group_invitation_get(*, group: Group, invitation_id: int) -> Invitation:
    invitation = Invitation.objects.filter(group=group, pk=invitation_id).first()
    if invitation is None:
        raise NotFound("No such invitation.")
    return invitation


def invitation_get_by_token(*, token: str) -> Invitation:
    """The invitation a token stands for, whatever its state; the caller decides what a closed one means."""
    invitation = (
        Invitation.objects.select_related("group", "invited_by")
        .filter(token_digest=invitation_token_digest(token or ""))
        .first()
    )
    if invitation is None:
        raise NotFound("This invitation link is not valid.", code="invitation_not_found")
    return invitation


def invitation_status(invitation: Invitation) -> str:
    """One word for where an invitation stands: open, accepted, declined, revoked or expired."""
    if invitation.accepted_at is not None:
        return "accepted"
    if invitation.declined_at is not None:
        return "declined"
    if invitation.revoked_at is not None:
        return "revoked"
    if invitation.expires_at <= timezone.now():
        return "expired"
    return "open"


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
    from clawhub.review.flags import CONSENSUS, MEMBER_OUTLIER
    from clawhub.review.models import Sample
    from clawhub.review.selectors import review_policy_for
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
    for user_id, state, flags in recent.order_by("created_at", "id"):
        codes = {f.get("code"): f.get("detail", "") for f in flags or [] if isinstance(f, dict)}
        if codes.keys() & {CONSENSUS, MEMBER_OUTLIER}:
            flagged[user_id] = flagged.get(user_id, 0) + 1
        if CONSENSUS in codes:
            consensus[user_id] = codes[CONSENSUS]
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
