"""Invalidation of the gateway's cached active adapter of a tenant: a switch of the active version bumps the
tenant's generation in the shared cache (clawhub.core.generations), which the gateway compares with the one
its copy was read under in every request's admission round trip, and reads the adapter again when it moved."""

from clawhub.core.generations import generation, generation_bump, generation_cache_key, generation_now


def _name(tenant_id: int) -> str:
    return f"adaptergen:{tenant_id}"


def adapter_cache_generation(*, tenant_id: int) -> str:
    """The tenant's generation, created if it has none: what a read records before reading the adapter."""
    return generation(_name(tenant_id))


def adapter_cache_generation_now(*, tenant_id: int) -> str:
    return generation_now(_name(tenant_id))


def adapter_cache_generation_key(*, tenant_id: int) -> str:
    """Where the shared cache keeps it (what the gateway's admission script reads)."""
    return generation_cache_key(_name(tenant_id))


def adapter_cache_invalidate(*, tenant_id: int) -> None:
    generation_bump(_name(tenant_id))
