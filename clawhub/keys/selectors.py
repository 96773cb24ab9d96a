"""Reads for API keys, including the hot lookup of a presented secret."""

import hashlib
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.core.exceptions import NotFound, PermissionDenied
from clawhub.groups.models import ROLE_RANK, Group, Membership, Role
from clawhub.groups.selectors import groups_for_user, has_role
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.scopes import DEFAULT_SCOPES
from clawhub.tenants import naming
from clawhub.tenants.models import Tenant

SECRET_PREFIX = "chk_"
BASE_MODEL_ID = naming.BASE_MODEL_ID  # the shared base model with no adapter; every tenant may use it


def secret_digest(secret: str) -> str:
    # Keys are 256 random bits, so a fast hash is enough; nothing is gained from a slow one.
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class ResolvedKey:
    key: ApiKey
    user: User
    tenant: Tenant
    # False for a rotated-out secret still inside its grace window, which ends at valid_until.
    current: bool = True
    valid_until: datetime | None = None

    @property
    def scopes(self) -> list[str]:
        """What this secret may do: the key's scopes, or inference only for a rotated-out secret."""
        return list(self.key.scopes or DEFAULT_SCOPES) if self.current else list(DEFAULT_SCOPES)


_KEY_ROLES = [role.value for role in Role if ROLE_RANK[role] >= ROLE_RANK[Role.MEMBER]]


def key_resolve(*, secret: str) -> ResolvedKey | None:
    """The key, user and tenant a presented secret stands for, or None if it is unknown or no longer valid.

    One indexed query on the digest joins everything the caller needs. A group key whose owner is no longer
    a member (or only a viewer) of the group is dead even if nothing revoked it: a user deleted in Django
    admin, or a membership row removed by hand, must not leave a live key to the group's adapter.
    """
    if not secret or not secret.startswith(SECRET_PREFIX):
        return None
    still_member = Membership.objects.filter(group=OuterRef("key__group_id"), user=OuterRef("key__owner_id"),
                                             role__in=_KEY_ROLES)
    row = (
        ApiKeySecret.objects.select_related("key__owner__tenant", "key__group__tenant")
        .annotate(owner_in_group=Exists(still_member))
        .filter(digest=secret_digest(secret))
        .first()
    )
    if row is None:
        return None
    key, now = row.key, timezone.now()
    if row.valid_until is not None and row.valid_until <= now:
        return None
    if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
        return None
    if not key.owner.is_active:
        return None
    if key.group_id and not row.owner_in_group:
        return None
    tenant = key.group.tenant if key.group_id else key.owner.tenant  # type: ignore[union-attr]  # group_id is set
    return ResolvedKey(key=key, user=key.owner, tenant=tenant, current=row.valid_until is None,
                       valid_until=row.valid_until)


def key_tenant(key: ApiKey) -> Tenant:
    """The tenant whose adapter a key reaches: the bound group's, else the owner's personal one."""
    return key.group.tenant if key.group_id else key.owner.tenant  # type: ignore[union-attr]  # group_id is set


def model_ids_for_tenant(tenant: Tenant) -> list[str]:
    """Every model id a key of this tenant could be allowed: the tenant's adapter first, then the base."""
    return naming.models_offered(tenant_model_id=tenant.model_id)


def models_for_key(key: ApiKey, *, tenant: Tenant | None = None) -> list[str]:
    """The model ids this key may use, in the order /v1/models lists them.

    ``allowed_models`` empty means everything the tenant offers. Pass ``tenant`` when the caller already has
    it (the gateway's ``ResolvedKey.tenant``) to spare the lookup.
    """
    tenant = tenant or key_tenant(key)
    return naming.models_for_key(tenant_model_id=tenant.model_id, allowed_models=key.allowed_models)


def keys_for_user(*, user: User, with_playground: bool = False) -> QuerySet[ApiKey]:
    """The user's keys, without the playground's short-lived ones (keys.services.playground_key_mint) unless
    ``with_playground`` (the privacy export: everything held about the user)."""
    keys = ApiKey.objects.filter(owner=user).select_related("group")
    return keys if with_playground else keys.filter(playground=False)


def key_get_for_owner(*, key_id: int, user: User) -> ApiKey:
    """The user's own key. Anyone else's key is a 404, so that key ids do not leak."""
    key = (ApiKey.objects.select_related("group", "owner").filter(pk=key_id, owner=user, playground=False)
           .first())
    if key is None:
        raise NotFound("No such key.")
    return key


def can_manage_group_keys(*, group: Group, user: User) -> bool:
    """Group owners and admins may see and revoke every key bound to their group."""
    return has_role(group=group, user=user, at_least=Role.ADMIN)


def _require_group_key_manager(*, group: Group, actor: User) -> None:
    if not can_manage_group_keys(group=group, user=actor):
        raise PermissionDenied("Only the group's owners and admins may manage its keys.")


def keys_for_group(*, group: Group, actor: User) -> QuerySet[ApiKey]:
    """Every key bound to the group, for its owners and admins."""
    _require_group_key_manager(group=group, actor=actor)
    return ApiKey.objects.filter(group=group, playground=False).select_related("group", "owner")


def key_get_in_group(*, group: Group, key_id: int, actor: User) -> ApiKey:
    """A key bound to the group, for its owners and admins. The role is checked before the key is looked up,
    so that members cannot probe which key ids exist."""
    _require_group_key_manager(group=group, actor=actor)
    key = (ApiKey.objects.select_related("group", "owner").filter(pk=key_id, group=group, playground=False)
           .first())
    if key is None:
        raise NotFound("No such key in this group.")
    return key


def groups_for_key_binding(*, user: User) -> QuerySet[Group]:
    """Groups the user may bind a new key to: member role or above (viewers may not)."""
    return groups_for_user(user=user, at_least=Role.MEMBER)


def group_for_key_binding(*, slug: str, user: User) -> Group:
    """The group named in a create request. Groups the user is not in read as unknown, so names do not leak;
    the member-role check itself is the service's."""
    group = Group.objects.filter(slug=slug, memberships__user=user).first() if user.is_authenticated else None
    if group is None:
        raise NotFound("No such group.", field="group")
    return group
