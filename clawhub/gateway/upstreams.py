"""The pool of vLLM upstreams: health, routing, and adapter residency shared by every gateway worker.

Residency. vLLM is the source of truth for which adapters an upstream serves: a name registered with
``/v1/load_lora_adapter`` stays servable until someone unloads it, and vLLM itself decides which of them
hold its GPU slots (``--max-loras``) and its CPU cache (``--max-cpu-loras``), reloading an evicted one from
its path on the next request. So the gateway never unloads an adapter to make room (an unload frees nothing
vLLM would not free itself, and would pull the name from under another worker's request); only retired
versions are unloaded, by the adapter drain sweep, after their drain period. Each worker keeps a local view
(``Upstream.adapters``), learned from the upstream's ``/v1/models`` at every health check and from its own
loads; the shared view in Redis (``gw:res:<url>``, a hash of adapter name -> version id) tells every worker
at once what another one just loaded, so a tenant whose first request lands on a second worker finds its
adapter without a load. A load is single-flight across workers: one worker takes a short Redis lock
(``gw:load:<url>:<name>``) and loads, the others wait for the name to appear in the shared view (vLLM's own
per-name lock and its "already loaded" answer make a second load harmless when Redis is away). An adapter
vLLM no longer knows (it restarted, or the drain sweep unloaded an old version) answers 404: it is dropped
from both views and loaded again, once, single-flight.

In flight is counted from dispatch (before the request is sent), per upstream and per adapter in this worker,
for least-loaded routing; across workers, each request holds a lease on its adapter name in Redis (see
clawhub.gateway.quotas), which the drain sweep can ask about (clawhub.adapters.selectors.adapter_in_flight).

Routing: only upstreams of the tenants' base model (the first configured upstream's ``base_model``; others,
e.g. a judge's model, get no tenant traffic), healthy ones first; among them those that already serve the
adapter, then the tenant's own upstream by rendezvous hashing (its prefix cache lives there), then the least
loaded. The database registry (adapters.models) mirrors the local view through the writer thread so training
can see which upstream holds which adapter version (clawhub.adapters.registry writes it).
"""

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from clawhub.adapters.vllm_admin import VllmAdmin, adapter_names
from clawhub.core.aio import cancel_and_wait
from clawhub.core.metrics import ADAPTER_LOAD_DURATION, ADAPTER_LOADS, REDIS_FAILURES
from clawhub.core.model_limits import max_model_len_of
from clawhub.gateway.dbreads import share_blocking
from clawhub.gateway.errors import upstream_refused
from clawhub.gateway.quotas import AdapterGeneration

logger = logging.getLogger("clawhub.gateway")

HEALTH_TIMEOUT = 2.0
# A busy vLLM can answer one health check late; only a refused connection or this many slow or failed
# checks in a row take a healthy upstream out of rotation (with one upstream, a flap means 503s for a whole
# health interval).
HEALTH_MISSES = 3
LOAD_TIMEOUT = 120.0
REGISTRY_EVERY = 30.0  # seconds between registry refreshes of last_used_at
LOAD_POLL = 0.05  # seconds between looks at the shared view while another worker loads


@dataclass(frozen=True, slots=True)
class ActiveAdapter:
    id: int
    name: str  # "t<tenant>-v<version>", never reused for other weights
    path: str


def active_adapter_blocking(tenant_id: int) -> ActiveAdapter | None:
    from clawhub.adapters.selectors import active_adapter_for_tenant

    version = active_adapter_for_tenant(tenant_id=tenant_id)
    if version is None:
        return None
    return ActiveAdapter(id=version.pk, name=version.upstream_name, path=version.artifact_path)


@dataclass(frozen=True, slots=True)
class TenantAdapter:
    """A tenant's active adapter as the gateway caches it, with the generation it was read under (None: the
    shared cache did not answer, so it is not checked until the next read)."""

    adapter: ActiveAdapter | None
    generation: AdapterGeneration | None


def tenant_adapter_blocking(tenant_id: int) -> TenantAdapter:
    """The generation first, then the row: a switch committed after the read moves the generation away
    from the one recorded (it is bumped after the commit), so admission sees it and the row is read again."""
    from clawhub.adapters.cache import adapter_cache_generation, adapter_cache_generation_key

    try:
        generation = AdapterGeneration(tenant_id, adapter_cache_generation_key(tenant_id=tenant_id),
                                       adapter_cache_generation(tenant_id=tenant_id))
    except Exception:  # noqa: BLE001 - the shared cache is down: serve the adapter, unchecked, as quotas do
        logger.warning("adapter generation of tenant %s unreadable; served unchecked until its next read",
                       tenant_id, exc_info=True)
        generation = None
    current = TenantAdapter(active_adapter_blocking(tenant_id), generation)
    if generation is not None:  # for gateway processes that start during a database outage
        share_blocking(_shared_name(tenant_id), current)
    return current


def _shared_name(tenant_id: int) -> str:
    return f"gw:known-adapter:{tenant_id}"


def shared_tenant_adapter_blocking(tenant_id: int) -> TenantAdapter | None:
    """What another process read as the tenant's active adapter, if its generation has not moved since."""
    from django.core.cache import cache

    from clawhub.adapters.cache import adapter_cache_generation_now

    value = cache.get(_shared_name(tenant_id))
    if not isinstance(value, TenantAdapter) or value.generation is None:
        return None
    return value if adapter_cache_generation_now(tenant_id=tenant_id) == value.generation.expected else None


def version_adapter_blocking(tenant_id: int, version: int) -> ActiveAdapter | None:
    """One version of the tenant's adapter, whatever its state, or None if it has no weights (yet)."""
    from clawhub.adapters.selectors import adapter_version_for_tenant

    row = adapter_version_for_tenant(tenant_id=tenant_id, version=version)
    if row is None:
        return None
    return ActiveAdapter(id=row.pk, name=row.upstream_name, path=row.artifact_path)


@dataclass(slots=True)
class Loaded:
    version_id: int | None
    last_used: float = field(default_factory=time.monotonic)
    inflight: int = 0  # this worker's requests on it, from dispatch to the end of the response
    registered: bool = True  # False: vLLM does not know the name (not loaded yet, or it answered 404)


class Upstream:
    def __init__(self, url: str, base_model: str, max_adapters: int = 8, api_key: str = ""):
        self.url = url.rstrip("/")
        self.base_model = base_model
        self.max_adapters = max_adapters  # vLLM's --max-cpu-loras, for the registry; not a gateway bound
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        self.admin = VllmAdmin(self.url, self.headers)  # loads and lists its adapters
        self.healthy = True  # optimistic until the first check says otherwise
        self.misses = 0  # failed health checks in a row
        self.synced = False
        self.inflight = 0
        self.adapters: dict[str, Loaded] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.registry_written = 0.0
        self.max_model_len: int | None = None  # from /v1/models at each sync; see limits.py
        self.weight = hashlib.blake2b(self.url.encode(), digest_size=8).digest()

    def __repr__(self) -> str:
        return f"<Upstream {self.url} healthy={self.healthy} inflight={self.inflight}>"


def _rendezvous(up: Upstream, tenant_id: int) -> bytes:
    tenant = tenant_id.to_bytes(8, "little", signed=True)
    return hashlib.blake2b(tenant, key=up.weight, digest_size=8).digest()


class SharedResidency:
    """The Redis side of residency: the shared view and the cross-worker load lock. Every call is bounded by
    ``timeout``; when Redis does not answer, residency works per worker (vLLM's answers stay the truth)."""

    def __init__(self, url: str, *, timeout: float):
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._timeout = timeout
        self._down_until = 0.0

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, make, default=None):
        """``make()``: the Redis call's coroutine, made only when Redis is believed up."""
        if time.monotonic() < self._down_until:
            return default
        try:
            return await asyncio.wait_for(make(), self._timeout * 2)
        except Exception as exc:  # noqa: BLE001 - any Redis trouble: work without the shared view
            REDIS_FAILURES.labels(part="residency").inc()
            if time.monotonic() >= self._down_until:
                logger.warning("residency store unreachable (%s); adapters are tracked per worker",
                               type(exc).__name__)
            self._down_until = time.monotonic() + 1.0
            return default

    async def has(self, url: str, name: str) -> bool:
        return bool(await self._call(lambda: self._redis.hexists(f"gw:res:{url}", name), default=False))

    async def add(self, url: str, name: str, version_id: int | None) -> None:
        await self._call(lambda: self._redis.hset(f"gw:res:{url}", name, str(version_id or "")))

    async def drop(self, url: str, name: str) -> None:
        await self._call(lambda: self._redis.hdel(f"gw:res:{url}", name))

    async def replace(self, url: str, names: set[str]) -> None:
        """What the upstream's /v1/models listed: the shared view follows it (vLLM is the truth)."""
        async def run() -> None:
            key = f"gw:res:{url}"
            known = {n.decode() for n in await self._redis.hkeys(key)}
            pipe = self._redis.pipeline(transaction=False)
            gone = known - names
            if gone:
                pipe.hdel(key, *gone)
            for name in names - known:
                pipe.hsetnx(key, name, "")
            await pipe.execute()

        await self._call(run)  # noqa: PLW0108

    async def lock(self, url: str, name: str, token: str) -> bool | None:
        """True: this worker loads; False: another one is loading; None: Redis is away (load anyway)."""
        result = await self._call(lambda: self._redis.set(f"gw:load:{url}:{name}", token, nx=True,
                                                          px=int(LOAD_TIMEOUT * 1000)), default="down")
        return None if result == "down" else bool(result)

    async def locked(self, url: str, name: str) -> bool:
        return bool(await self._call(lambda: self._redis.exists(f"gw:load:{url}:{name}"), default=0))

    async def unlock(self, url: str, name: str) -> None:
        await self._call(lambda: self._redis.delete(f"gw:load:{url}:{name}"))


class UpstreamPool:
    def __init__(self, configs: list[dict], client: httpx.AsyncClient, *, health_interval: float,
                 writer=None, shared: SharedResidency | None = None):
        self.upstreams = [Upstream(c["url"], c.get("base_model") or "base", int(c.get("max_adapters") or 8),
                                   c.get("api_key") or "") for c in configs]
        # Tenants' adapters are trained on one base model: the first upstream's. Upstreams of another base
        # model get no tenant traffic.
        self.base_model = self.upstreams[0].base_model if self.upstreams else "base"
        self._client, self._interval, self._writer = client, health_interval, writer
        self._registry_due: dict[str, Callable[[], None]] = {}  # url -> its newest registry write, queued
        self._registry_lock = threading.Lock()  # the writer's thread takes them
        self._shared = shared
        self._task: asyncio.Task | None = None
        self._token = f"{id(self):x}-{time.time_ns():x}"

    async def start(self) -> None:
        await asyncio.gather(*(self.check(up) for up in self.upstreams))
        self._task = asyncio.create_task(self._health_loop(), name="gateway-health")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._shared is not None:
            await self._shared.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await asyncio.gather(*(self.check(up) for up in self.upstreams), return_exceptions=True)

    async def check(self, up: Upstream) -> bool:
        refused = False
        try:
            response = await self._client.get(f"{up.url}/health", timeout=HEALTH_TIMEOUT)
            ok = response.status_code == 200
        except httpx.ConnectError:
            ok, refused = False, True
        except httpx.HTTPError:
            ok = False
        if ok:
            # Every check re-reads what the upstream serves: loads by other workers and by promotion, unloads
            # by the drain sweep, a restart that forgot everything.
            synced = await self._sync(up)
            ok = synced or up.synced  # a slow /v1/models after a good /health keeps the last view
        up.misses = 0 if ok else up.misses + 1
        if not ok and up.healthy and not refused and up.misses < HEALTH_MISSES:
            logger.info("upstream %s missed a health check (%d in a row)", up.url, up.misses)
            return False
        changed = ok != up.healthy
        up.healthy = ok
        if not ok:
            up.synced = False  # a restarted vLLM forgets its adapters: learn them again when it is back
        if changed:
            logger.warning("upstream %s is %s", up.url, "healthy" if ok else "unhealthy")
        if changed or time.monotonic() - up.registry_written > REGISTRY_EVERY:
            self._write_registry(up)
        return ok

    async def _sync(self, up: Upstream) -> bool:
        """Learns which adapters the upstream holds now (vLLM's /v1/models is the truth)."""
        models = await up.admin.models_async(self._client, timeout=HEALTH_TIMEOUT)
        if models is None:
            return False
        names = adapter_names(models)
        up.max_model_len = max_model_len_of(models, up.base_model) or up.max_model_len
        for name, loaded in list(up.adapters.items()):
            if name not in names and name not in up.locks:
                if loaded.inflight == 0:
                    del up.adapters[name]
                else:
                    loaded.registered = False
        for name in names:
            loaded = up.adapters.get(name)
            if loaded is None:
                up.adapters[name] = Loaded(version_id=None, last_used=0.0)
            else:
                loaded.registered = True
        up.synced = True
        if self._shared is not None:
            await self._shared.replace(up.url, names)
        return True

    def candidates(self, adapter_name: str | None, tenant_id: int = 0) -> list[Upstream]:
        """Healthy upstreams of the tenants' base model, best first: those already serving the adapter, then
        the tenant's own (rendezvous hashing keeps a tenant on one upstream, where its prefix cache is), then
        the least loaded."""
        serving = [up for up in self.upstreams if up.healthy and up.base_model == self.base_model]
        if adapter_name is None:
            return sorted(serving, key=lambda up: (up.inflight, _rendezvous(up, tenant_id)))
        return sorted(serving, key=lambda up: (not self._known(up, adapter_name), _rendezvous(up, tenant_id),
                                               up.inflight))

    def max_model_len(self) -> int | None:
        """The smallest context length the serving upstreams reported (None: none did yet)."""
        known = [up.max_model_len for up in self.upstreams
                 if up.max_model_len and up.base_model == self.base_model]
        return min(known) if known else None

    def mark_unhealthy(self, up: Upstream) -> None:
        if up.healthy:
            logger.warning("upstream %s failed a connection; marked unhealthy", up.url)
            up.healthy, up.synced = False, False
            self._write_registry(up)

    def begin(self, up: Upstream, adapter_name: str | None) -> None:
        """At dispatch, before the request is sent: from here on it counts for routing."""
        up.inflight += 1
        if adapter_name is not None:
            loaded = up.adapters.get(adapter_name)
            if loaded is None:
                loaded = up.adapters[adapter_name] = Loaded(version_id=None, registered=False)
            loaded.inflight += 1
            loaded.last_used = time.monotonic()

    def end(self, up: Upstream, adapter_name: str | None) -> None:
        up.inflight -= 1
        if adapter_name is not None:
            loaded = up.adapters.get(adapter_name)
            if loaded is not None and loaded.inflight > 0:
                loaded.inflight -= 1

    async def forget(self, up: Upstream, adapter_name: str) -> None:
        """The upstream no longer knows this adapter (it answered 404): load it again on the next request."""
        loaded = up.adapters.get(adapter_name)
        if loaded is not None:
            loaded.registered = False
            if loaded.inflight == 0:
                up.adapters.pop(adapter_name, None)
        if self._shared is not None:
            await self._shared.drop(up.url, adapter_name)

    def _known(self, up: Upstream, name: str) -> bool:
        loaded = up.adapters.get(name)
        return loaded is not None and loaded.registered

    async def ensure_loaded(self, up: Upstream, adapter: ActiveAdapter) -> None:
        if self._known(up, adapter.name):
            return
        lock = up.locks.get(adapter.name)
        if lock is None:
            lock = up.locks[adapter.name] = asyncio.Lock()
        try:
            async with lock:  # single flight in this worker; the Redis lock makes it so across workers
                if self._known(up, adapter.name):
                    return
                # Shielded: a client that goes away mid-load must not leave the load half done for the
                # requests waiting on it.
                await asyncio.shield(self._load_once_everywhere(up, adapter))
        finally:
            if not lock.locked():
                up.locks.pop(adapter.name, None)
        self._write_registry(up)

    def _mark_loaded(self, up: Upstream, adapter: ActiveAdapter) -> None:
        loaded = up.adapters.get(adapter.name)
        if loaded is None:
            up.adapters[adapter.name] = Loaded(version_id=adapter.id)
        else:
            loaded.version_id, loaded.registered = adapter.id, True

    async def _load_once_everywhere(self, up: Upstream, adapter: ActiveAdapter) -> None:
        shared = self._shared
        if shared is None:
            await self._load(up, adapter)
            self._mark_loaded(up, adapter)
            return
        deadline = time.monotonic() + LOAD_TIMEOUT
        while True:
            if await shared.has(up.url, adapter.name):
                self._mark_loaded(up, adapter)  # another worker loaded it
                return
            mine = await shared.lock(up.url, adapter.name, self._token)
            if mine is not False:
                try:
                    await self._load(up, adapter)
                    await shared.add(up.url, adapter.name, adapter.id)
                finally:
                    if mine:
                        await shared.unlock(up.url, adapter.name)
                self._mark_loaded(up, adapter)
                return
            # Another worker is loading it: wait for the shared view to say so (or for its lock to go).
            while await shared.locked(up.url, adapter.name):
                if time.monotonic() > deadline:
                    raise upstream_refused("The model server did not finish loading this model's adapter.")
                await asyncio.sleep(LOAD_POLL)

    async def _load(self, up: Upstream, adapter: ActiveAdapter) -> None:
        started = time.perf_counter()
        try:
            answer = await up.admin.load_async(self._client, name=adapter.name, path=adapter.path,
                                               timeout=LOAD_TIMEOUT)
        except httpx.HTTPError:
            ADAPTER_LOADS.labels(outcome="error").inc()
            raise
        finally:
            ADAPTER_LOAD_DURATION.observe(time.perf_counter() - started)
        # A name loaded twice is loaded: another worker (or promotion) got there first.
        if not answer.done:
            ADAPTER_LOADS.labels(outcome="error").inc()
            logger.error("loading adapter %s on %s failed: %s %s", adapter.name, up.url, answer.status,
                         answer.shape)
            raise upstream_refused("The model server could not load this model's adapter.")
        ADAPTER_LOADS.labels(outcome="already" if answer.already else "ok").inc()

    def _write_registry(self, up: Upstream) -> None:
        if self._writer is None:
            return
        up.registry_written = time.monotonic()
        url, base, cap, healthy = up.url, up.base_model, up.max_adapters, up.healthy
        known = {name: loaded for name, loaded in up.adapters.items() if loaded.registered}
        names = list(known)
        versions = {name: loaded.version_id for name, loaded in known.items()}
        wall = time.time() - time.monotonic()
        used = {name: loaded.last_used + wall for name, loaded in known.items() if loaded.last_used}

        def write() -> None:
            from datetime import UTC, datetime

            from clawhub.adapters.registry import loaded_adapter_sync, upstream_record_health

            if healthy:
                loaded_adapter_sync(url=url, base_model=base, max_adapters=cap, adapter_names=names,
                                    version_ids=versions,
                                    last_used={n: datetime.fromtimestamp(t, UTC) for n, t in used.items()})
            else:
                upstream_record_health(url=url, base_model=base, max_adapters=cap, healthy=False)

        # Only the newest state of an upstream is written: a burst of loads (a tenant wave after a restart)
        # queued one full sync per load, each an UPDATE per loaded adapter (200 loads: 20,000 statements).
        with self._registry_lock:
            queued = up.url in self._registry_due
            self._registry_due[up.url] = write
        if not queued and not self._writer.submit_op(lambda: self._write_due(url)):
            with self._registry_lock:  # dropped (the thread's queue is full): the next state tries again
                self._registry_due.pop(url, None)

    def _write_due(self, url: str) -> None:
        """On the writer's thread: the newest registry state of the upstream at ``url``."""
        with self._registry_lock:
            write = self._registry_due.pop(url, None)
        if write is not None:
            write()
