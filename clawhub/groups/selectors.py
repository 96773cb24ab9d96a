"""Reads for groups and memberships."""

from clawhub.core.exceptions import NotFound
from clawhub.groups.models import ROLE_RANK, Group, Membership, Role


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


def groups_for_user(*, user):
    return Group.objects.filter(memberships__user=user).order_by("name")
