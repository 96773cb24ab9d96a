"""Writes for API keys: create, update, rotate, revoke."""

import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clawhub.accounts.audit import audit_record
from clawhub.accounts.models import User
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from clawhub.core.updates import model_update
from clawhub.groups.models import Group, Role
from clawhub.groups.selectors import has_role
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.scopes import DEFAULT_SCOPES, scopes_clean
from clawhub.keys.selectors import (
    SECRET_PREFIX,
    can_manage_group_keys,
    key_tenant,
    model_ids_for_tenant,
    secret_digest,
)
from clawhub.tenants.models import Tenant


class _Unset:
    """Marks an argument of key_update that was not given (None means "clear it")."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def _new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _validate_limits(**limits: int | None) -> None:
    for name, value in limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValidationFailed(f"{name} must be a positive integer or empty.", field=name)


def _validate_expiry(expires_at: datetime | None) -> None:
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("The expiry must be in the future.", field="expires_at")


def _clean_allowed_models(allowed_models: Iterable[str] | None, *, tenant: Tenant) -> list[str]:
    """Deduplicated, in the order given; every id must be one the key's tenant can use."""
    if allowed_models is None:
        return []
    if isinstance(allowed_models, str):
        # A lone string would otherwise be read as a list of one-letter model ids.
        raise ValidationFailed("allowed_models must be a list of model ids.", field="allowed_models")
    offered = model_ids_for_tenant(tenant)
    cleaned: list[str] = []
    for model_id in allowed_models:
        if model_id not in offered:
            # As OpenAI answers an unknown model: 404 model_not_found (the ids depend on the key's tenant).
            raise NotFound(
                f"Unknown model {model_id!r} for this key; choose among {', '.join(offered)}.",
                code="model_not_found", field="allowed_models", allowed=offered,
            )
        if model_id not in cleaned:
            cleaned.append(model_id)
    return cleaned


def _require_held(scopes: Iterable[str], *, via_scopes: list[str] | None, doing: str) -> None:
    """Refuses when the key that made the request (``via_scopes``; None for a signed-in session) lacks one of
    ``scopes``: whatever hands out a secret must not hand out more than the asking key holds, or a `keys` key
    could mint, or rotate its way to, an `export` one."""
    if via_scopes is None:
        return
    beyond = [s for s in scopes if s not in via_scopes]
    if beyond:
        raise PermissionDenied(
            f"An API key cannot {doing} scopes it does not hold ({', '.join(beyond)}); "
            "sign in to the web site to do it.", code="insufficient_scope", scopes=beyond)


def _clean_scopes(scopes: Iterable[str] | None, *, via_scopes: list[str] | None) -> list[str]:
    """The scopes to store; ``via_scopes`` as in _require_held."""
    try:
        cleaned = scopes_clean(DEFAULT_SCOPES if scopes is None else scopes)
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="scopes") from None
    _require_held(cleaned, via_scopes=via_scopes, doing="grant")
    return cleaned


@transaction.atomic
def key_create(
    *,
    owner: User,
    name: str,
    group: Group | None = None,
    scopes: list[str] | None = None,
    via_scopes: list[str] | None = None,
    allowed_models: list[str] | None = None,
    rpm_limit: int | None = UNSET,
    tpm_limit: int | None = UNSET,
    concurrency_limit: int | None = UNSET,
    expires_at: datetime | None = None,
    ip: str | None = None,
    playground: bool = False,
) -> tuple[ApiKey, str]:
    """Creates a key and returns it with its clear secret, which is never stored and never shown again.

    ``scopes`` defaults to inference only; ``via_scopes`` are the scopes of the API key that asked, if any.
    A limit not given is the site's default for new keys (``KEY_DEFAULT_*_LIMIT``); None is no limit.
    """
    rpm_limit, tpm_limit, concurrency_limit = (
        default if value is UNSET else value
        for value, default in ((rpm_limit, settings.KEY_DEFAULT_RPM_LIMIT),
                               (tpm_limit, settings.KEY_DEFAULT_TPM_LIMIT),
                               (concurrency_limit, settings.KEY_DEFAULT_CONCURRENCY_LIMIT)))
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A key needs a name.", field="name")
    if group is not None and not has_role(group=group, user=owner, at_least=Role.MEMBER):
        raise PermissionDenied("Only members of a group may bind a key to it.")
    _validate_expiry(expires_at)
    _validate_limits(rpm_limit=rpm_limit, tpm_limit=tpm_limit, concurrency_limit=concurrency_limit)
    tenant = group.tenant if group is not None else owner.tenant
    allowed = _clean_allowed_models(allowed_models, tenant=tenant)
    scopes = _clean_scopes(scopes, via_scopes=via_scopes)
    secret = _new_secret()
    key = ApiKey.objects.create(
        owner=owner,
        group=group,
        name=name,
        prefix=secret[:8],
        last4=secret[-4:],
        allowed_models=allowed,
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        concurrency_limit=concurrency_limit,
        expires_at=expires_at,
        scopes=scopes,
        playground=playground,
    )
    ApiKeySecret.objects.create(key=key, digest=secret_digest(secret))
    audit_record(actor=owner, action="key.create", target=key, subject_user=owner, group=group, ip=ip,
                 scopes=scopes, via_key=via_scopes is not None,
                 **({"playground": True} if playground else {}))
    return key, secret


@transaction.atomic
def playground_key_mint(*, actor: User, group: Group | None = None,
                        ip: str | None = None) -> tuple[ApiKey, str]:
    """A key for the playground page, held by the signed-in user's browser in memory while the page is open:
    nobody pastes a secret into the page, and none is kept in the browser's storage or in plain text here (a
    digest, like every key). It can do little: inference only, for PLAYGROUND_KEY_TTL, absent from the key
    pages (so it cannot be rotated into a lasting key), and its turns are playground turns, trained on only
    once rated. Minting revokes the user's earlier playground keys for the same adapter, so at most one
    lives; a second tab's page asks for a fresh one when its key stops working."""
    earlier = ApiKey.objects.select_for_update().filter(owner=actor, group=group, playground=True,
                                                          revoked_at__isnull=True)
    now = timezone.now()
    for key in earlier:
        key.revoked_at = now
        key.save(update_fields=["revoked_at"])
        _forget_cached_key(key)
    return key_create(owner=actor, name="Playground", group=group,
                      expires_at=now + settings.PLAYGROUND_KEY_TTL, ip=ip, playground=True)


@transaction.atomic
def key_update(
    *,
    key: ApiKey,
    actor: User,
    name: str = UNSET,
    allowed_models: list[str] | None = UNSET,
    rpm_limit: int | None = UNSET,
    tpm_limit: int | None = UNSET,
    concurrency_limit: int | None = UNSET,
    expires_at: datetime | None = UNSET,
    scopes: list[str] = UNSET,
    via_scopes: list[str] | None = None,
    ip: str | None = None,
) -> ApiKey:
    """Changes what the owner may change on a key. Arguments left out stay as they are; None clears a limit,
    the expiry or the model list (empty = every model the tenant offers). ``via_scopes`` as in key_create: an
    API key changes only keys that hold no scope it lacks (lifting the expiry of an `export` key from a `keys`
    one would lengthen a power it does not have)."""
    if actor.pk != key.owner_id:
        raise PermissionDenied("Only the key's owner may change it.")
    _require_held(key.scopes or DEFAULT_SCOPES, via_scopes=via_scopes, doing="change a key with")
    if key.revoked_at is not None:
        raise Conflict("A revoked key cannot be changed.", code="key_revoked")
    changes: dict[str, Any] = {}
    if name is not UNSET:
        name = (name or "").strip()
        if not name:
            raise ValidationFailed("A key needs a name.", field="name")
        changes["name"] = name
    if allowed_models is not UNSET:
        changes["allowed_models"] = _clean_allowed_models(allowed_models, tenant=key_tenant(key))
    limits = {field: value for field, value in
              (("rpm_limit", rpm_limit), ("tpm_limit", tpm_limit), ("concurrency_limit", concurrency_limit))
              if value is not UNSET}
    _validate_limits(**limits)
    changes.update(limits)
    if expires_at is not UNSET:
        _validate_expiry(expires_at)
        changes["expires_at"] = expires_at
    if scopes is not UNSET:
        changes["scopes"] = _clean_scopes(scopes, via_scopes=via_scopes)
    changed = model_update(instance=key, fields=list(changes), data=changes)
    if not changed:
        return key
    audit_record(
        actor=actor, action="key.update", target=key, subject_user=key.owner, group=key.group, ip=ip,
        changes={field: value.isoformat() if isinstance(value, datetime) else value
                 for field, (_, value) in changed.items()},
    )
    # Limits and model lists are read from the gateway's cached copy of the key.
    _forget_cached_key(key)
    return key


@transaction.atomic
def key_rotate(*, key: ApiKey, actor: User, via_key: ApiKey | None = None,
               via_scopes: list[str] | None = None, ip: str | None = None) -> str:
    """Gives the key a new secret. The previous secrets keep working until the grace window ends, for /v1
    only (a rotated-out secret is inference-only).

    ``via_key`` is the API key that asked, if one did, and ``via_scopes`` what its secret may do. A key may
    not rotate itself: rotation is what the owner does after a leak, and a thief holding the key would
    otherwise be handed the new secret. Nor may it rotate a key holding a scope it lacks: the new secret
    would be that scope, handed to it (the rule of key_create).
    """
    if actor.pk != key.owner_id:
        # Whoever rotates sees the new secret, so nobody but the owner may.
        raise PermissionDenied("Only the key's owner may rotate it.")
    if via_key is not None and via_key.pk == key.pk:
        raise PermissionDenied("A key cannot rotate itself; rotate it from the web site or with another key.",
                               code="self_rotation")
    _require_held(key.scopes or DEFAULT_SCOPES, via_scopes=via_scopes, doing="rotate a key with")
    if key.revoked_at is not None:
        raise Conflict("A revoked key cannot be rotated.", code="key_revoked")
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


def _may_revoke(*, key: ApiKey, actor: User) -> bool:
    if actor.pk == key.owner_id or actor.is_staff:
        return True
    return key.group_id is not None and can_manage_group_keys(group=key.group, user=actor)  # type: ignore[arg-type]  # group_id is set


@transaction.atomic
def key_revoke(*, key: ApiKey, actor: User, ip: str | None = None, reason: str = "") -> ApiKey:
    """Ends a key for good. Its owner, the bound group's owners and admins, and site staff may do it."""
    if not _may_revoke(key=key, actor=actor):
        raise PermissionDenied("You may not revoke this key.")
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="key.revoke", target=key, subject_user=key.owner, group=key.group,
                     ip=ip, reason=reason)
        _forget_cached_key(key)
    return key


@transaction.atomic
def keys_revoke_all(*, owner: User, actor: User | None, reason: str, created_before: datetime | None = None,
                    ip: str | None = None) -> int:
    """Revokes every live key of ``owner`` (only those made before ``created_before`` when given), each
    through key_revoke so that gateways drop it and the revocation is audited. Returns how many."""
    keys = ApiKey.objects.filter(owner=owner, revoked_at__isnull=True).select_related("owner", "group")
    if created_before is not None:
        keys = keys.filter(created_at__lt=created_before)
    count = 0
    for key in keys:
        # The owner may always revoke their own keys; ``actor`` None is the system acting for them.
        key_revoke(key=key, actor=actor or owner, ip=ip, reason=reason)
        count += 1
    return count


def keys_cached_invalidate(*, owner_id: int, group_id: int | None = None) -> int:
    """Tells every gateway process to look up again the live keys of ``owner_id`` (only those bound to
    ``group_id`` when given), after the transaction commits. Returns how many.

    For changes made around the services that decide whether a key still works (a user deactivated, a
    membership removed or demoted in Django admin): they bump no key's generation otherwise, and gateways
    would serve the old state until their cached lookups expire (GATEWAY_KEY_CACHE_SECONDS)."""
    from clawhub.keys.cache import key_cache_invalidate

    keys = ApiKey.objects.filter(owner_id=owner_id, revoked_at__isnull=True)
    if group_id is not None:
        keys = keys.filter(group_id=group_id)
    key_ids = list(keys.values_list("pk", flat=True))
    if key_ids:
        def invalidate() -> None:
            for key_id in key_ids:
                key_cache_invalidate(key_id=key_id)

        transaction.on_commit(invalidate)
    return len(key_ids)


def _forget_cached_key(key: ApiKey) -> None:
    """Tells every gateway process to drop its cached lookup of this key (after the transaction commits)."""
    from clawhub.keys.cache import key_cache_invalidate

    transaction.on_commit(lambda: key_cache_invalidate(key_id=key.pk))
