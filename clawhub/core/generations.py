"""Generations in the shared cache (Redis, or the embedded stack's file cache): how a change tells every
gateway process that what it cached about a thing (a key's lookup, a tenant's active adapter) is old.

A process records the generation a lookup was made under; the gateway compares it with the current one on
every request (in its admission round trip) and looks the thing up again when they differ. Only a
*different* generation matters, never a larger one, so the value can be lost safely: a lookup makes sure the
thing has one (``generation``), and an entry that is lost (evicted, or culled from the file cache) reads as
``ABSENT``, which differs from every value a lookup saw. A bump of a missing entry writes a random value, so
it cannot land on the value a lookup is adding at the same moment.
"""

import secrets

from django.core.cache import cache

ABSENT = "0"  # what a missing generation reads as (the gateway's admission script says the same)


def _fresh() -> int:
    return secrets.randbelow(2**62) + 1


def generation(name: str) -> str:
    """The generation ``name`` holds, created if it has none: what a lookup records before reading."""
    value = cache.get(name)
    if value is None:
        cache.add(name, _fresh(), timeout=None)
        value = cache.get(name)
    return ABSENT if value is None else str(value)


def generation_now(name: str) -> str:
    """The generation as it is (``ABSENT`` if it has none), without creating one."""
    value = cache.get(name)
    return ABSENT if value is None else str(value)


def generation_bump(name: str) -> None:
    try:
        cache.incr(name)
    except ValueError:
        cache.set(name, _fresh(), timeout=None)


def generation_cache_key(name: str) -> str:
    """Where the shared cache keeps ``name`` (its key prefix and version applied): what Redis scripts read."""
    return cache.make_key(name)
