"""Invalidation of cached key lookups. The gateway caches resolved keys; a revoke, rotate or change bumps a
per-key generation in the shared cache (clawhub.core.generations), which gateway processes compare with the
one their copy was looked up under before trusting it."""

from clawhub.core.generations import ABSENT, generation, generation_bump, generation_now

__all__ = ["ABSENT", "key_cache_generation", "key_cache_generation_now", "key_cache_invalidate"]


def _generation_key(key_id: int) -> str:
    return f"keygen:{key_id}"


def key_cache_generation(*, key_id: int) -> str:
    """The key's generation, created if it has none: what a lookup records before reading the key."""
    return generation(_generation_key(key_id))


def key_cache_generation_now(*, key_id: int) -> str:
    """The key's generation as it is (``ABSENT`` if it has none), without creating one."""
    return generation_now(_generation_key(key_id))


def key_cache_invalidate(*, key_id: int) -> None:
    generation_bump(_generation_key(key_id))
