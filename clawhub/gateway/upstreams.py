"""The pool of vLLM upstreams: health, tenant affinity, adapter load-on-demand with single flight, LRU unload.

State lives in this process (one pool per gateway worker); the database registry (gateway.models) mirrors it
through the writer thread so training can see which upstream holds which adapter version. vLLM answers 400 to
loading a name twice, which also happens when another gateway worker loaded it first: that counts as loaded.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field

import httpx

from clawhub.core.metrics import ADAPTER_EVICTIONS, ADAPTER_LOAD_DURATION, ADAPTER_LOADS
from clawhub.gateway.errors import upstream_refused
from clawhub.gateway.limits import max_model_len_of
from workers.judge.judges import body_shape  # what an error body looked like, never its text

logger = logging.getLogger("clawhub.gateway")

HEALTH_TIMEOUT = 2.0
# A busy vLLM can answer one health check late; only a refused connection or this many slow or failed
# checks in a row take a healthy upstream out of rotation (with one upstream, a flap means 503s for a whole
# health interval).
HEALTH_MISSES = 3
LOAD_TIMEOUT = 120.0
REGISTRY_EVERY = 30.0  # seconds between registry refreshes of last_used_at


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


@dataclass(slots=True)
class Loaded:
    version_id: int | None
    last_used: float = field(default_factory=time.monotonic)
    inflight: int = 0


class Upstream:
    def __init__(self, url: str, base_model: str, max_adapters: int = 8, api_key: str = ""):
        self.url = url.rstrip("/")
        self.base_model = base_model
        self.max_adapters = max_adapters
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        self.healthy = True  # optimistic until the first check says otherwise
        self.misses = 0  # failed health checks in a row
        self.synced = False
        self.inflight = 0
        self.adapters: dict[str, Loaded] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.registry_written = 0.0
        self.max_model_len: int | None = None  # from /v1/models at each sync; see limits.py

    def __repr__(self) -> str:
        return f"<Upstream {self.url} healthy={self.healthy} inflight={self.inflight}>"


class UpstreamPool:
    def __init__(self, configs: list[dict], client: httpx.AsyncClient, *, health_interval: float,
                 writer=None):
        self.upstreams = [Upstream(c["url"], c.get("base_model") or "base", int(c.get("max_adapters") or 8),
                                   c.get("api_key") or "") for c in configs]
        self._client, self._interval, self._writer = client, health_interval, writer
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await asyncio.gather(*(self.check(up) for up in self.upstreams))
        self._task = asyncio.create_task(self._health_loop(), name="gateway-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

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
        if ok and not up.synced:
            ok = await self._sync(up)
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
        """Learns which adapters the upstream already holds (loaded by another worker, or before a
        restart)."""
        try:
            response = await self._client.get(f"{up.url}/v1/models", headers=up.headers,
                                              timeout=HEALTH_TIMEOUT)
            models = response.json()["data"] if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            models = None
        if models is None:
            return False
        names = {m["id"] for m in models if isinstance(m, dict) and m.get("parent")}
        up.max_model_len = max_model_len_of(models, up.base_model) or up.max_model_len
        for name in list(up.adapters):
            if name not in names and up.adapters[name].inflight == 0:
                del up.adapters[name]
        for name in names:
            up.adapters.setdefault(name, Loaded(version_id=None, last_used=0.0))
        up.synced = True
        return True

    def candidates(self, adapter_name: str | None) -> list[Upstream]:
        """Healthy upstreams, best first: those already holding the adapter, then the least loaded."""
        healthy = [up for up in self.upstreams if up.healthy]
        if adapter_name is None:
            return sorted(healthy, key=lambda up: up.inflight)
        return sorted(healthy, key=lambda up: (adapter_name not in up.adapters, up.inflight))

    def mark_unhealthy(self, up: Upstream) -> None:
        if up.healthy:
            logger.warning("upstream %s failed a connection; marked unhealthy", up.url)
            up.healthy, up.synced = False, False
            self._write_registry(up)

    def begin(self, up: Upstream, adapter_name: str | None) -> None:
        up.inflight += 1
        if adapter_name is not None:
            loaded = up.adapters.get(adapter_name)
            if loaded is not None:
                loaded.inflight += 1
                loaded.last_used = time.monotonic()

    def end(self, up: Upstream, adapter_name: str | None) -> None:
        up.inflight -= 1
        if adapter_name is not None:
            loaded = up.adapters.get(adapter_name)
            if loaded is not None and loaded.inflight > 0:
                loaded.inflight -= 1

    def forget(self, up: Upstream, adapter_name: str) -> None:
        """The upstream no longer knows this adapter (it answered 404): load it again on the next request."""
        up.adapters.pop(adapter_name, None)

    async def ensure_loaded(self, up: Upstream, adapter: ActiveAdapter) -> None:
        loaded = up.adapters.get(adapter.name)
        if loaded is not None:
            loaded.last_used = time.monotonic()
            return
        lock = up.locks.get(adapter.name)
        if lock is None:
            lock = up.locks[adapter.name] = asyncio.Lock()
        async with lock:  # single flight: concurrent first requests wait for one load
            if adapter.name in up.adapters:
                return
            await self._make_room(up, keep=adapter.name)
            started = time.perf_counter()
            try:
                response = await self._client.post(
                    f"{up.url}/v1/load_lora_adapter", headers=up.headers, timeout=LOAD_TIMEOUT,
                    json={"lora_name": adapter.name, "lora_path": adapter.path},
                )
            except httpx.HTTPError:
                ADAPTER_LOADS.labels(outcome="error").inc()
                raise
            finally:
                ADAPTER_LOAD_DURATION.observe(time.perf_counter() - started)
            already = response.status_code == 400 and "already" in response.text
            if response.status_code != 200 and not already:
                ADAPTER_LOADS.labels(outcome="error").inc()
                logger.error("loading adapter %s on %s failed: %s %s", adapter.name, up.url,
                             response.status_code, body_shape(response))
                raise upstream_refused("The model server could not load this model's adapter.")
            ADAPTER_LOADS.labels(outcome="ok").inc()
            up.adapters[adapter.name] = Loaded(version_id=adapter.id)
        up.locks.pop(adapter.name, None)
        self._write_registry(up)

    async def _make_room(self, up: Upstream, keep: str) -> None:
        while len(up.adapters) >= up.max_adapters:
            idle = [(loaded.last_used, name) for name, loaded in up.adapters.items()
                    if loaded.inflight == 0 and name != keep and name not in up.locks]
            if not idle:
                # Everything is busy: go over capacity rather than fail; vLLM keeps extra adapters on the CPU.
                logger.warning("upstream %s is over its adapter capacity (%d)", up.url, up.max_adapters)
                return
            _, victim = min(idle)
            await self.unload(up, victim, reason="lru")

    async def unload(self, up: Upstream, adapter_name: str, *, reason: str = "lru") -> None:
        """reason: the ADAPTER_EVICTIONS label, "lru" (over capacity) or "retired" (an old version)."""
        # Forget first so no new request is routed to the adapter while vLLM drops it.
        up.adapters.pop(adapter_name, None)
        ADAPTER_EVICTIONS.labels(reason=reason).inc()
        try:
            response = await self._client.post(f"{up.url}/v1/unload_lora_adapter", headers=up.headers,
                                               json={"lora_name": adapter_name}, timeout=LOAD_TIMEOUT)
            if response.status_code not in (200, 404):
                logger.warning("unloading %s on %s: %s", adapter_name, up.url, response.status_code)
        except httpx.HTTPError as exc:
            logger.warning("unloading %s on %s failed: %s", adapter_name, up.url, exc)
        self._write_registry(up)

    def _write_registry(self, up: Upstream) -> None:
        if self._writer is None:
            return
        up.registry_written = time.monotonic()
        url, base, cap, healthy = up.url, up.base_model, up.max_adapters, up.healthy
        names = list(up.adapters)
        versions = {name: loaded.version_id for name, loaded in up.adapters.items()}
        wall = time.time() - time.monotonic()
        used = {name: loaded.last_used + wall for name, loaded in up.adapters.items() if loaded.last_used}

        def write() -> None:
            from datetime import UTC, datetime

            from clawhub.gateway.services import loaded_adapter_sync, upstream_record_health

            if healthy:
                loaded_adapter_sync(url=url, base_model=base, max_adapters=cap, adapter_names=names,
                                    version_ids=versions,
                                    last_used={n: datetime.fromtimestamp(t, UTC) for n, t in used.items()})
            else:
                upstream_record_health(url=url, base_model=base, max_adapters=cap, healthy=False)

        self._writer.submit_op(write)

