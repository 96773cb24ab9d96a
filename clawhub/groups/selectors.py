"""Reads for groups, memberships and invitations."""

import hashlib

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


# The largest id PostgreSQL's bigint holds: a larger one from a URL is no member, not a database error.
ID_MAX = 2**63 - 1


def group_member_get(*, group: Group, user_id: int) -> Membership:
    if not 0 < user_id <= ID_MAX:
        raise NotFound("No such member.")
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
