"""Invalidation of cached key lookups. The gateway caches resolved keys briefly; a revoke, rotate or change
bumps a per-key generation in the shared cache (Redis, or the embedded stack's file cache), which gateway
processes compare with the one their copy was looked up under before trusting it.

Only a *different* generation matters, never a larger one, so the value can be lost safely: a lookup makes
sure the key has one (``key_cache_generation``), and an entry that is lost (evicted, or culled from the file
cache) reads as "0", which differs from every value a lookup saw. A bump of a missing entry writes a random
value, so it cannot land on the value a lookup is adding at the same moment.
"""

import secrets

from django.core.cache import cache

ABSENT = "0"  # what a missing generation reads as (the gateway's admission script says the same)


def _generation_key(key_id: int) -> str:
    return f"keygen:{key_id}"


def _fresh() -> int:
    return secrets.randbelow(2**62) + 1


def key_cache_generation(*, key_id: int) -> str:
    """The key's generation, created if it has none: what a lookup records before reading the key."""
    name = _generation_key(key_id)
    value = cache.get(name)
    if value is None:
        cache.add(name, _fresh(), timeout=None)
        value = cache.get(name)
    return ABSENT if value is None else str(value)


def key_cache_generation_now(*, key_id: int) -> str:
    """The key's generation as it is (``ABSENT`` if it has none), without creating one."""
    value = cache.get(_generation_key(key_id))
    return ABSENT if value is None else str(value)


def key_cache_invalidate(*, key_id: int) -> None:
    try:
        cache.incr(_generation_key(key_id))
    except ValueError:
        cache.set(_generation_key(key_id), _fresh(), timeout=None)
