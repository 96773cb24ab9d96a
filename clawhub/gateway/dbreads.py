"""Database reads off the event loop, cached in-process with single flight.

The hot path must never block on the ORM; the rare reads (a key not seen for a few seconds, a tenant's active
adapter) run on a small dedicated thread pool, and concurrent misses for the same thing share one query.

Serving through a database outage: a read that fails or takes longer than GATEWAY_DB_TIMEOUT is answered from
the last good value, for up to GATEWAY_STALE_SECONDS past its TTL (counted in
``clawhub_gateway_stale_served``), and tried again after STALE_RETRY seconds, so the first read that succeeds
(a revocation included) replaces it. A process that knows nothing of it (a worker or pod started during the
outage) asks the shared cache, where every good lookup is put for as long (keys and tenant adapters, each
checked against its current generation there, so a revocation made before the outage is not served). With
nothing known, the request gets 503 with Retry-After, never 500.
"""

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections

from clawhub.core.db import keep_usable_connection
from clawhub.core.metrics import GATEWAY_STALE_SERVED, GATEWAY_UNAVAILABLE
from clawhub.gateway.errors import GatewayError

logger = logging.getLogger("clawhub.gateway")

DB_THREADS = 4
STALE_RETRY = 1.0  # while the database is down, a stale value is served this long before the next try
# A cached value that admission keeps confirming (its generation unchanged) is read again all the same after
# ten of its TTLs, at most ten minutes: what a change made around the services (a bare SQL update) waits for.
CONFIRMED_TTLS = 10
CONFIRMED_MAX_AGE = 600.0


def shared_seconds() -> float:
    """How long a key's or an adapter's lookup stays in the shared cache (Redis) for other gateway processes
    to serve through a database outage: GATEWAY_STALE_SECONDS, as long as a process serves its own copy. Each
    entry expires on its own, so the cache holds at most the keys and tenants used in that time."""
    return _setting("GATEWAY_STALE_SECONDS", 3600.0)


def share_blocking(name: str, value: Any) -> None:
    """Puts a fresh lookup in the shared cache (on a read thread; a shared cache that is away is no error)."""
    from django.core.cache import cache

    try:
        cache.set(name, value, timeout=shared_seconds())
    except Exception:  # noqa: BLE001
        logger.warning("could not share %s", name, exc_info=True)


async def shared_get(name: str) -> Any:
    from django.core.cache import cache

    return await asyncio.to_thread(cache.get, name)


def unavailable(what: str, retry_after: int) -> GatewayError:
    return GatewayError(503, f"The gateway cannot check this {what} right now (its database is unreachable). "
                        "Try again shortly.", type="api_error", code="service_unavailable",
                        retry_after=retry_after)


def _setting(name: str, default: float) -> float:
    from django.conf import settings

    return getattr(settings, name, default)


def _with_usable_connection(fn: Callable[..., Any], *args: Any) -> Any:
    # Threads outlive requests, so Django never recycles their connections: each thread keeps its own
    # connection and drops it only when an error left it broken (a database restart, an outage). Django's
    # close_old_connections would reconnect for every read with DATABASE_CONN_MAX_AGE=0, the web's default.
    keep_usable_connection()
    return fn(*args)


class DbRunner:
    def __init__(self, threads: int = DB_THREADS):
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gateway-db")

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _with_usable_connection, fn, *args)

    def close(self) -> None:
        """Closes every worker thread's connection (each thread must close its own), then the pool.

        One task per thread, held at a barrier, makes sure every thread takes exactly one of them; otherwise
        the test database could not be dropped and PostgreSQL would keep idle sessions around.
        """
        barrier = threading.Barrier(self._threads)

        def close_mine() -> None:
            connections.close_all()
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass

        for _ in range(self._threads):
            self._pool.submit(close_mine)
        self._pool.shutdown(wait=True)


class CachedLoader:
    """key -> value, loaded by an async loader at most once per ``ttl`` seconds per key, misses coalesced.

    A failed or timed-out load serves the last good value (see the module docstring) or raises a 503
    GatewayError naming ``what``.
    """

    def __init__(self, loader: Callable[[Any], Awaitable[Any]], *, ttl: float, max_size: int = 50_000,
                 what: str = "adapter", stale_for: float | None = None, timeout: float | None = None,
                 shared: Callable[[Hashable], Awaitable[Any]] | None = None):
        """``shared``: where to look when a load fails and this process knows nothing of ``key`` (a worker
        started during the outage): the value another process shared (see SHARED_SECONDS), or None."""
        self._loader, self._ttl, self._max = loader, ttl, max_size
        self._shared = shared
        self._what = what
        self._stale_for = _setting("GATEWAY_STALE_SECONDS", 3600.0) if stale_for is None else stale_for
        self._timeout = _setting("GATEWAY_DB_TIMEOUT", 2.0) if timeout is None else timeout
        self._retry_after = int(_setting("GATEWAY_UNAVAILABLE_RETRY_AFTER", 5))
        # key -> (fresh until, value, when it was last loaded)
        self._values: dict[Hashable, tuple[float, Any, float]] = {}
        self._pending: dict[Hashable, asyncio.Future] = {}
        self._failing_since: float | None = None

    def peek(self, key: Hashable) -> tuple[bool, Any]:
        hit = self._values.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    async def get(self, key: Hashable, loader_arg: Any = None) -> Any:
        found, value = self.peek(key)
        if found:
            return value
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            try:
                value = await asyncio.wait_for(self._loader(key if loader_arg is None else loader_arg),
                                               self._timeout)
            except (asyncio.CancelledError, GatewayError):
                raise
            except Exception as exc:
                value = await self._stale(key, exc)
            else:
                if self._failing_since is not None:
                    logger.info("%s lookups answer again", self._what)
                    self._failing_since = None
                self.put(key, value)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody may be waiting
            raise
        finally:
            self._pending.pop(key, None)
        future.set_result(value)
        return value

    async def _stale(self, key: Hashable, exc: Exception) -> Any:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            logger.warning("%s lookup failed (%s: %s); serving what is known", self._what, type(exc).__name__,
                           exc)
        hit = self._values.get(key)
        if hit is not None and now - hit[2] <= self._ttl + self._stale_for:
            GATEWAY_STALE_SERVED.labels(what=self._what).inc()
            self._values[key] = (now + STALE_RETRY, hit[1], hit[2])
            return hit[1]
        shared = await self._shared_value(key) if self._shared is not None else None
        if shared is not None:
            GATEWAY_STALE_SERVED.labels(what=self._what).inc()
            self._values[key] = (now + STALE_RETRY, shared, now)
            return shared
        GATEWAY_UNAVAILABLE.labels(what=self._what).inc()
        raise unavailable(self._what, self._retry_after) from None

    async def _shared_value(self, key: Hashable) -> Any:
        try:
            return await asyncio.wait_for(self._shared(key), self._timeout)
        except Exception:  # noqa: BLE001 - the shared cache is away too: nothing known
            logger.warning("shared %s cache unreadable", self._what, exc_info=True)
            return None

    def put(self, key: Hashable, value: Any, ttl: float | None = None) -> None:
        if len(self._values) >= self._max:
            self._evict()
        now = time.monotonic()
        self._values[key] = (now + (self._ttl if ttl is None else ttl), value, now)

    def _evict(self) -> None:
        # A flood of unknown keys must not grow memory without bound, nor wipe what serves known keys through
        # an outage: drop the expired entries, and only if that is not enough, everything.
        now = time.monotonic()
        self._values = {k: v for k, v in self._values.items() if v[0] > now}
        if len(self._values) >= self._max:
            self._values.clear()

    def confirm(self, key: Hashable) -> None:
        """``key``'s value was just found current (its generation unchanged): fresh for another ``ttl``, up to
        CONFIRMED_TTLS ttls (at most CONFIRMED_MAX_AGE) after it was read. So a value in use is not read again
        every ``ttl`` while the generations vouch for it, and still expires within ``ttl`` once nothing
        confirms it (Redis away)."""
        hit = self._values.get(key)
        if hit is not None:
            now = time.monotonic()
            max_age = max(self._ttl, min(self._ttl * CONFIRMED_TTLS, CONFIRMED_MAX_AGE))
            fresh = min(now + self._ttl, hit[2] + max_age)
            if fresh > hit[0]:
                self._values[key] = (fresh, hit[1], hit[2])

    def forget(self, key: Hashable) -> None:
        self._values.pop(key, None)

    def clear(self) -> None:
        self._values.clear()
