"""Writes for API keys: create, rotate, revoke, update."""

import secrets
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record
from clawhub.core.exceptions import PermissionDenied, ValidationFailed
from clawhub.groups.models import Group, Role
from clawhub.groups.selectors import has_role
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.selectors import SECRET_PREFIX, secret_digest


def _new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _validate_limits(**limits: int | None) -> None:
    for name, value in limits.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValidationFailed(f"{name} must be a positive integer or empty.", field=name)


@transaction.atomic
def key_create(
    *,
    owner: User,
    name: str,
    group: Group | None = None,
    allowed_models: list[str] | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    concurrency_limit: int | None = None,
    expires_at: datetime | None = None,
    ip: str | None = None,
) -> tuple[ApiKey, str]:
    """Creates a key and returns it with its clear secret, which is never stored and never shown again."""
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A key needs a name.", field="name")
    if group is not None and not has_role(group=group, user=owner, at_least=Role.MEMBER):
        raise PermissionDenied("Only members of a group may bind a key to it.")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("The expiry must be in the future.", field="expires_at")
    _validate_limits(rpm_limit=rpm_limit, tpm_limit=tpm_limit, concurrency_limit=concurrency_limit)
    secret = _new_secret()
    key = ApiKey.objects.create(
        owner=owner,
        group=group,
        name=name,
        prefix=secret[:8],
        last4=secret[-4:],
        allowed_models=list(allowed_models or []),
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        concurrency_limit=concurrency_limit,
        expires_at=expires_at,
    )
    ApiKeySecret.objects.create(key=key, digest=secret_digest(secret))
    audit_record(actor=owner, action="key.create", target=key, subject_user=owner, group=group, ip=ip)
    return key, secret


@transaction.atomic
def key_rotate(*, key: ApiKey, actor: User, ip: str | None = None) -> str:
    """Gives the key a new secret. The previous secrets keep working until the grace window ends."""
    if key.revoked_at is not None:
        raise ValidationFailed("A revoked key cannot be rotated.", code="key_revoked")
    now = timezone.now()
    grace_end = now + settings.KEY_ROTATION_GRACE
    ApiKeySecret.objects.filter(key=key, valid_until__isnull=True).update(valid_until=grace_end)
    ApiKeySecret.objects.filter(key=key, valid_until__gt=grace_end).update(valid_until=grace_end)
    secret = _new_secret()
    ApiKeySecret.objects.create(key=key, digest=secret_digest(secret))
    key.prefix, key.last4 = secret[:8], secret[-4:]
    key.save(update_fields=["prefix", "last4"])
    audit_record(actor=actor, action="key.rotate", target=key, subject_user=key.owner, group=key.group, ip=ip,
                 grace_until=grace_end.isoformat())
    _forget_cached_key(key)
    return secret


@transaction.atomic
def key_revoke(*, key: ApiKey, actor: User, ip: str | None = None, reason: str = "") -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="key.revoke", target=key, subject_user=key.owner, group=key.group,
                     ip=ip, reason=reason)
        _forget_cached_key(key)
    return key


def _forget_cached_key(key: ApiKey) -> None:
    """Tells every gateway process to drop its cached lookup of this key (after the transaction commits)."""
    from clawhub.keys.cache import key_cache_invalidate

    transaction.on_commit(lambda: key_cache_invalidate(key_id=key.pk))
