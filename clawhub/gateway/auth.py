"""API key lookup for /v1: an indexed query in a worker thread, then kept in an in-process cache.

The cache is keyed by the secret's SHA-256 digest (never the secret). A revoke, rotate or change bumps the
key's generation in the shared cache (clawhub.keys.cache: Redis, or the embedded stack's file cache); each
lookup records the generation it was made under, and every /v1 request compares it with the current one
before trusting the copy: completions in the quota check's own round trip (the admission script with Redis,
LocalLimiter without), /v1/models and /v1/feedback with one read of it. A changed generation sends the
request back here for a fresh lookup, so a revocation holds from the next request on, in every mode. An
admission that finds the generation unchanged keeps the lookup fresh (``KeyCache.confirm``), so a key in use
is not read again every GATEWAY_KEY_CACHE_SECONDS, only when nothing confirmed it for that long (Redis away)
or ten lifetimes (at most ten minutes) after its read.

While the database is unreachable, keys seen recently are served from their last good lookup (and a key whose
generation moved on is forgotten first, so a revocation is never served stale), in a process started during
the outage from the lookup another process shared in Redis (checked against the key's generation there); a
key never seen gets 503 with Retry-After (clawhub.gateway.dbreads).
"""

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

from clawhub.gateway.dbreads import CachedLoader, DbRunner, share_blocking
from clawhub.tenants import naming

logger = logging.getLogger("clawhub.gateway")


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """The plain fields of a resolved key the hot path needs; safe to share between requests."""

    key_id: int
    user_id: int
    tenant_id: int
    group_id: int | None
    model_id: str  # the tenant-facing model id: "clawhub-personal" or "clawhub-group-<slug>"
    allowed_models: frozenset[str]
    rpm: int | None
    tpm: int | None
    concurrency: int | None
    expires_at: float | None  # unix seconds: the key's expiry, or the presented secret's grace end if sooner
    generation_key: str  # where clawhub.keys.cache keeps this key's generation in the shared cache
    # A playground key: may name any version of its tenant's adapter, and its turns are playground turns.
    playground: bool = False

    def models(self) -> list[str]:
        """The client-facing model ids this key may use, in a stable order."""
        return naming.models_for_key(tenant_model_id=self.model_id, allowed_models=self.allowed_models)


def presented_secret(headers: dict[bytes, bytes]) -> str | None:
    auth = headers.get(b"authorization")
    if auth and auth[:7].lower() == b"bearer ":
        return auth[7:].strip().decode("latin-1") or None
    key = headers.get(b"x-api-key")
    return key.strip().decode("latin-1") if key else None


def resolve_key_blocking(secret: str) -> tuple[KeyInfo | None, str | None]:
    """Runs in a worker thread: the key resolve, flattened into plain fields, and the generation it holds for.

    The generation is read between two resolves: a change committed before the read is seen by the second
    resolve, one after it moves the generation away from the one recorded. (One resolve then a read would miss
    a revocation committed between the two, and serve it until the cache entry expires.) Two indexed queries
    per cache miss, none per request.
    """
    from django.core.cache import cache

    from clawhub.keys.cache import key_cache_generation
    from clawhub.keys.selectors import key_resolve

    first = key_resolve(secret=secret)
    if first is None:
        return None, None
    try:
        generation = key_cache_generation(key_id=first.key.pk)
    except Exception:  # noqa: BLE001 - the shared cache is down: serve the key, unchecked, as quotas do
        logger.warning("key generation unreadable; key %s served without the check until its next lookup",
                       first.key.pk, exc_info=True)
        generation = None
    resolved = key_resolve(secret=secret)
    if resolved is None:
        return None, None
    key = resolved.key
    model_id = naming.tenant_model_id(group_slug=key.group.slug if key.group_id else None)
    return KeyInfo(
        key_id=key.pk,
        user_id=key.owner_id,
        tenant_id=resolved.tenant.pk,
        group_id=key.group_id,
        model_id=model_id,
        allowed_models=frozenset(key.allowed_models or ()),
        rpm=key.rpm_limit,
        tpm=key.tpm_limit,
        concurrency=key.concurrency_limit,
        # A rotated-out secret ends with its grace window, even while its lookup is cached.
        expires_at=min((t.timestamp() for t in (key.expires_at, resolved.valid_until) if t), default=None),
        generation_key=cache.make_key(f"keygen:{key.pk}"),
        playground=key.playground,
    ), generation


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(slots=True)
class CachedKey:
    info: KeyInfo | None
    generation: str | None = None  # what the lookup was made under; None only for an unknown secret


def _shared_name(digest: str) -> str:
    return f"gw:known-key:{digest}"  # the secret's SHA-256, never the secret


def _resolve_and_share_blocking(secret: str, digest: str) -> CachedKey:
    """A key's lookup, shared (dbreads.share_blocking) for gateway processes that start during an outage."""
    entry = CachedKey(*resolve_key_blocking(secret))
    if entry.info is not None and entry.generation is not None:
        share_blocking(_shared_name(digest), entry)
    return entry


def _shared_key_blocking(digest: str) -> CachedKey | None:
    """What another process looked up for this secret, if its key's generation has not moved since (a key
    revoked, rotated or changed meanwhile is not served from there)."""
    from django.core.cache import cache

    from clawhub.keys.cache import key_cache_generation_now

    entry = cache.get(_shared_name(digest))
    if not isinstance(entry, CachedKey) or entry.info is None:
        return None
    return entry if key_cache_generation_now(key_id=entry.info.key_id) == entry.generation else None


class KeyCache:
    def __init__(self, db: DbRunner, *, ttl: float):
        self._db = db
        self._cache = CachedLoader(self._load, ttl=ttl, what="key", shared=self._shared)

    async def _load(self, secret: str) -> CachedKey:
        return await self._db.run(_resolve_and_share_blocking, secret, _digest(secret))

    @staticmethod
    async def _shared(digest: str) -> CachedKey | None:
        # Not on the read threads: those may all be waiting on the database that is away.
        return await asyncio.to_thread(_shared_key_blocking, digest)

    async def lookup(self, secret: str) -> tuple[str, CachedKey]:
        digest = _digest(secret)
        entry = await self._cache.get(digest, secret)
        info = entry.info
        if info is not None and info.expires_at is not None and info.expires_at <= time.time():
            return digest, CachedKey(None)
        return digest, entry

    def confirm(self, digest: str) -> None:
        """Admission found the key's generation unchanged: its lookup stays fresh (CachedLoader.confirm)."""
        self._cache.confirm(digest)

    def forget(self, digest: str) -> None:
        self._cache.forget(digest)
