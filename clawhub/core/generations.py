"""Generations in the shared cache (Redis, or the embedded stack's file cache): how a change tells every
gateway process that what it cached about a thing (a key's lookup, a tenant's active adapter) is old.

A process records the generation a lookup was made under; the gateway compares it with the current one on
every request (in its admission round trip) and looks the thing up again when they differ. Only a
*different* generation matters, never a larger one, so the value can be lost safely: a lookup makes sure the
thing has one (``generation``), and an entry that is lost (evicted, or culled from the file cache) reads as
``ABSENT``, which differs from every value a lookup saw. A bump of a missing entry writes a random value, so
it cannot land on the value a lookup is adding at the same moment.

A bump that fails (the shared cache unreachable when the change commits) is not lost: it is written to the
database (``PendingGenerationBump``) and the periodic sweep (``generations_bump_pending``) makes it once the
cache answers. Without that, a gateway that kept its copy through a short outage would go on confirming the
old generation for up to ten cache lifetimes.
"""

import logging
import secrets

from django.core.cache import cache
from django.utils import timezone

from clawhub.core import metrics

log = logging.getLogger(__name__)

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


def _bump(name: str) -> None:
    try:
        cache.incr(name)
    except ValueError:
        cache.set(name, _fresh(), timeout=None)


def generation_bump(name: str) -> None:
    """Moves ``name``'s generation; if the shared cache does not answer, the bump is kept for the sweep."""
    try:
        _bump(name)
    except Exception:
        log.warning("generation %s not bumped (the shared cache did not answer): kept for the sweep", name,
                    exc_info=True)
        metrics.GENERATION_BUMPS_DEFERRED.inc()
        from clawhub.core.models import PendingGenerationBump

        PendingGenerationBump.objects.update_or_create(name=name, defaults={"failed_at": timezone.now()})


def generations_bump_pending(*, limit: int = 1000) -> int:
    """Periodic: makes the bumps that failed, oldest first, and forgets each one made. Stops at the first
    that fails again (the cache still away: the next sweep tries). Returns how many were made."""
    from clawhub.core.models import PendingGenerationBump

    made = 0
    for row in PendingGenerationBump.objects.order_by("failed_at")[:limit]:
        try:
            _bump(row.name)
        except Exception:
            log.warning("generation bumps still pending: the shared cache does not answer", exc_info=True)
            break
        # A failure after this bump wrote a later failed_at: that row stays for the next sweep.
        PendingGenerationBump.objects.filter(pk=row.pk, failed_at=row.failed_at).delete()
        made += 1
    return made


def generation_cache_key(name: str) -> str:
    """Where the shared cache keeps ``name`` (its key prefix and version applied): what Redis scripts read."""
    return cache.make_key(name)
