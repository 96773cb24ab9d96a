"""Database reads off the event loop, cached in-process with single flight.

The hot path must never block on the ORM; the rare reads (a key not seen for a few seconds, a tenant's active
adapter) run on a small dedicated thread pool, and concurrent misses for the same thing share one query.
"""

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import close_old_connections, connections

DB_THREADS = 4


def _with_fresh_connection(fn: Callable[..., Any], *args: Any) -> Any:
    # Threads outlive requests, so Django never recycles their connections; drop broken or stale ones here.
    close_old_connections()
    return fn(*args)


class DbRunner:
    def __init__(self, threads: int = DB_THREADS):
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gateway-db")

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, _with_fresh_connection, fn, *args)

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
    """key -> value, loaded by an async loader at most once per ``ttl`` seconds per key, misses coalesced."""

    def __init__(self, loader: Callable[[Any], Awaitable[Any]], *, ttl: float, max_size: int = 50_000):
        self._loader, self._ttl, self._max = loader, ttl, max_size
        self._values: dict[Hashable, tuple[float, Any]] = {}
        self._pending: dict[Hashable, asyncio.Future] = {}

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
            value = await self._loader(key if loader_arg is None else loader_arg)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody may be waiting
            raise
        finally:
            self._pending.pop(key, None)
        self.put(key, value)
        future.set_result(value)
        return value

    def put(self, key: Hashable, value: Any, ttl: float | None = None) -> None:
        if len(self._values) >= self._max:
            self._values.clear()  # a flood of unknown keys must not grow memory without bound
        self._values[key] = (time.monotonic() + (self._ttl if ttl is None else ttl), value)

    def forget(self, key: Hashable) -> None:
        self._values.pop(key, None)

    def clear(self) -> None:
        self._values.clear()
