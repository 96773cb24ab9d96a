"""Invalidation of cached key lookups. The gateway caches resolved keys briefly; a revoke or rotate bumps a
per-key generation in the shared cache, which gateway processes compare before trusting their copy."""

from django.core.cache import cache


def _generation_key(key_id: int) -> str:
    return f"keygen:{key_id}"


def key_cache_generation(*, key_id: int) -> int:
    return cache.get(_generation_key(key_id), 0)


def key_cache_invalidate(*, key_id: int) -> None:
    try:
        cache.incr(_generation_key(key_id))
    except ValueError:
        cache.set(_generation_key(key_id), 1, timeout=None)
