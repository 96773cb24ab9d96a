"""Reads for API keys, including the hot lookup of a presented secret."""

import hashlib
from dataclasses import dataclass

from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.tenants.models import Tenant

SECRET_PREFIX = "chk_"


def secret_digest(secret: str) -> str:
    # Keys are 256 random bits, so a fast hash is enough; nothing is gained from a slow one.
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class ResolvedKey:
    key: ApiKey
    user: User
    tenant: Tenant


def key_resolve(*, secret: str) -> ResolvedKey | None:
    """The key, user and tenant a presented secret stands for, or None if it is unknown or no longer valid.

    One indexed query on the digest joins everything the caller needs.
    """
    if not secret or not secret.startswith(SECRET_PREFIX):
        return None
    row = (
        ApiKeySecret.objects.select_related("key__owner__tenant", "key__group__tenant")
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
    tenant = key.group.tenant if key.group_id else key.owner.tenant
    return ResolvedKey(key=key, user=key.owner, tenant=tenant)


def keys_for_user(*, user: User):
    return ApiKey.objects.filter(owner=user).select_related("group")


def key_get_for_owner(*, key_id: int, user: User) -> ApiKey:
    from clawhub.core.exceptions import NotFound

    key = ApiKey.objects.select_related("group").filter(pk=key_id, owner=user).first()
    if key is None:
        raise NotFound("No such key.")
    return key
