"""Who may change whose role, remove whom, and invite with which role: pure functions of roles.

The services enforce them (with an error that says why); the web pages use them to show only the controls that
would work.
"""

from clawhub.groups.models import ROLE_RANK, Role

# Roles an invitation or a role change can hand out; ownership only moves by transfer.
GRANTABLE_ROLES = (Role.ADMIN, Role.MEMBER, Role.VIEWER)


def can_manage(actor_role: Role | None) -> bool:
    """Admins and the owner manage members and invitations and rename the group."""
    return actor_role is not None and ROLE_RANK[actor_role] >= ROLE_RANK[Role.ADMIN]


def can_grant(actor_role: Role | None, role: Role) -> bool:
    """Whether the actor may hand out ``role`` (by invitation or role change): admins up to member, the owner
    up to admin."""
    if not can_manage(actor_role) or role not in GRANTABLE_ROLES:
        return False
    return role != Role.ADMIN or actor_role == Role.OWNER


def can_change_role(actor_role: Role | None, target_role: Role, new_role: Role) -> bool:
    return (target_role != Role.OWNER
            and can_grant(actor_role, target_role) and can_grant(actor_role, new_role))


def can_remove(actor_role: Role | None, target_role: Role) -> bool:
    return target_role != Role.OWNER and can_grant(actor_role, target_role)


def grantable_roles(actor_role: Role | None) -> list[Role]:
    return [role for role in GRANTABLE_ROLES if can_grant(actor_role, role)]
