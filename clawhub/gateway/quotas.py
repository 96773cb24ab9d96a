"""Per-key and per-group quotas: requests/min, tokens/min, concurrent requests.

Admission is ONE Redis round trip (a Lua script): it checks the key's cache generation, the fixed one-minute
windows for rpm and tpm and the concurrency leases, and only then counts the request.

Tokens are exact, not after the fact: admission *reserves* what the request may use at most (its prompt
estimate plus ``max_tokens`` x ``n``, see ``reservation``) and refuses it when that does not fit in what is
left of the minute; the release *settles* the reservation to the real usage (the difference is added to the
minute the reservation was made in). So a burst of concurrent requests cannot take a key or group past its
tpm: everything admitted in a minute, settled, is at most the limit as long as each request's real prompt is
within its estimate (bytes / 3, above what any tokenizer the gateway serves makes of JSON text). A request
whose reservation alone is larger than the limit is refused with a message that says so.

Concurrency slots are *leases*: a member of a sorted set scored by when it expires. Each gateway process
renews the leases of its running requests every ``lease_seconds / 3`` in one pipelined round trip, so a
stream may run for hours, and a crashed process's leases free within ``lease_seconds``. The same lease is
taken on the adapter name (``gw:busy:<name>``): how any process can tell an adapter is in use on some
gateway (clawhub.adapters.selectors.adapter_in_flight, which the drain sweep asks).

Every Redis call is bounded (GATEWAY_REDIS_TIMEOUT). When Redis does not answer in time the request is
admitted without limits (fail open: agents keep working) and counted in
``clawhub_redis_failures{part="quota"}``; for REDIS_RETRY_AFTER seconds after a failure admission does not
even try, so an outage costs no request more than one timeout.

Without Redis (the embedded default) ``LocalLimiter`` applies the same rules inside the process.
"""

import asyncio
import logging
import math
import time
from dataclasses import dataclass

from clawhub.core.aio import cancel_and_wait
from clawhub.core.generations import ABSENT
from clawhub.core.metrics import QUOTA_REJECTIONS, REDIS_FAILURES
from clawhub.core.resp import RespClient, Script
from clawhub.gateway.auth import KeyInfo
from clawhub.gateway.errors import rate_limited

WINDOW_TTL = 120  # a minute's counters live a little longer than their minute
REDIS_RETRY_AFTER = 1.0
DEFAULT_TIMEOUT = 0.25
DEFAULT_LEASE_SECONDS = 30.0
PROMPT_BYTES_PER_TOKEN = 3  # the reservation's prompt estimate: at least as many tokens as a tokenizer makes
DEFAULT_OUTPUT_RESERVE = 4096  # a request without max_tokens may write up to the model's context

logger = logging.getLogger("clawhub.gateway.quotas")

_ADMIT = """
local gen = redis.call('GET', KEYS[7]) or '0'  -- clawhub.core.generations.ABSENT
if ARGV[1] ~= '' and ARGV[1] ~= gen then return {-1, gen} end
if ARGV[15] ~= '' and ARGV[15] ~= (redis.call('GET', KEYS[9]) or '0') then return {-2, gen} end
local now = tonumber(ARGV[9])
local expires = now + tonumber(ARGV[11])
local cttl = math.ceil(tonumber(ARGV[11])) + 1
local reserve = tonumber(ARGV[13])
local function over(limit, key)
  if limit < 0 then return false end
  return tonumber(redis.call('GET', key) or '0') >= limit
end
local function tokens_over(limit, key)
  if limit < 0 then return 0 end
  if reserve > limit then return 2 end
  local used = tonumber(redis.call('GET', key) or '0')
  if used >= limit or used + reserve > limit then return 1 end
  return 0
end
local function conc_over(limit, key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if limit < 0 then return false end
  return redis.call('ZCARD', key) >= limit
end
if over(tonumber(ARGV[2]), KEYS[1]) then return {1, gen} end
local t = tokens_over(tonumber(ARGV[3]), KEYS[2])
if t == 1 then return {2, gen} elseif t == 2 then return {7, gen} end
if conc_over(tonumber(ARGV[4]), KEYS[3]) then return {3, gen} end
local grp = ARGV[8] == '1'
if grp then
  if over(tonumber(ARGV[5]), KEYS[4]) then return {4, gen} end
  t = tokens_over(tonumber(ARGV[6]), KEYS[5])
  if t == 1 then return {5, gen} elseif t == 2 then return {8, gen} end
  if conc_over(tonumber(ARGV[7]), KEYS[6]) then return {6, gen} end
end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[12])
if reserve > 0 then
  redis.call('INCRBY', KEYS[2], reserve)
  redis.call('EXPIRE', KEYS[2], ARGV[12])
end
redis.call('ZADD', KEYS[3], expires, ARGV[10])
redis.call('EXPIRE', KEYS[3], cttl)
if grp then
  redis.call('INCR', KEYS[4])
  redis.call('EXPIRE', KEYS[4], ARGV[12])
  if reserve > 0 then
    redis.call('INCRBY', KEYS[5], reserve)
    redis.call('EXPIRE', KEYS[5], ARGV[12])
  end
  redis.call('ZADD', KEYS[6], expires, ARGV[10])
  redis.call('EXPIRE', KEYS[6], cttl)
end
if ARGV[14] == '1' then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now)
  redis.call('ZADD', KEYS[8], expires, ARGV[10])
  redis.call('EXPIRE', KEYS[8], cttl)
end
return {0, gen}
"""

_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
local delta = tonumber(ARGV[2])
local function settle(key)
  if delta ~= 0 then
    if redis.call('EXISTS', key) == 1 then redis.call('INCRBY', key, delta)
    elseif delta > 0 then redis.call('SET', key, delta, 'EX', ARGV[5]) end
  end
end
settle(KEYS[2])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[3], ARGV[1])
  settle(KEYS[4])
end
if ARGV[4] == '1' then redis.call('ZREM', KEYS[5], ARGV[1]) end
return 0
"""

_REASONS = {  # code: (message, how Retry-After is found, the QUOTA_REJECTIONS label)
    1: ("Requests per minute limit reached for this key.", "window", "rpm"),
    2: ("Tokens per minute limit reached for this key (counting what running requests may still use).",
        "window", "tpm"),
    3: ("Too many concurrent requests for this key.", "slot", "concurrency"),
    4: ("Requests per minute limit reached for this group.", "window", "group_rpm"),
    5: ("Tokens per minute limit reached for this group (counting what running requests may still use).",
        "window", "group_tpm"),
    6: ("Too many concurrent requests for this group.", "slot", "group_concurrency"),
    7: ("This request may use more tokens (prompt plus max_tokens x n) than this key's tokens per minute "
        "limit allows; lower max_tokens or shorten the prompt.", "window", "tpm"),
    8: ("This request may use more tokens (prompt plus max_tokens x n) than this group's tokens per minute "
        "limit allows; lower max_tokens or shorten the prompt.", "window", "group_tpm"),
}


class AdapterMoved(Exception):
    """The tenant's active adapter changed since the gateway cached it (nothing counted): read it again."""


@dataclass(frozen=True, slots=True)
class AdapterGeneration:
    """The generation a tenant's cached active adapter was read under (clawhub.adapters.cache), which
    admission compares with the current one."""

    tenant_id: int
    key: str  # where the shared cache keeps it
    expected: str


@dataclass(frozen=True, slots=True)
class GroupLimits:
    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """What a running request holds: renewed while it runs, settled and dropped at release."""

    keys: tuple[str, ...]  # the sorted sets holding its lease (key, group, adapter)
    tpm_keys: tuple[str, ...]  # the minute counters its reservation went to (key[, group])
    reserve: int
    group: bool
    adapter_key: str


def reservation(body: dict, raw_size: int, output: int | None) -> int:
    """The most tokens a request may use: its prompt estimate plus ``output`` (its max_tokens, or the
    default reserve) times ``n``. ``raw_size``: the bytes of the whole request body."""
    n = body.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    out = output if output is not None and output > 0 else DEFAULT_OUTPUT_RESERVE
    return raw_size // PROMPT_BYTES_PER_TOKEN + 1 + out * n


def _limited(reason: int, now: float):
    message, kind, limit = _REASONS[reason]
    QUOTA_REJECTIONS.labels(limit=limit).inc()
    retry_after = 60 - int(now % 60) if kind == "window" else 1
    return rate_limited(message, retry_after)


def _lim(value: int | None) -> int:
    return -1 if value is None else value


def _names(info: KeyInfo, minute: int, adapter: str | None) -> tuple[str, str, str]:
    return f"gw:q:k{info.key_id}", f"gw:q:g{info.group_id}", f"gw:busy:{adapter or ''}"


class _Leases:
    """The leases of this process's running requests and the task that renews them."""

    def __init__(self, lease_seconds: float):
        self.lease_seconds = lease_seconds
        self.leases: dict[str, Lease] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._renew_loop(), name="gateway-leases")

    async def _stop_renewing(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            if self.leases:
                try:
                    await self._renew(time.time() + self.lease_seconds)
                except Exception:  # noqa: BLE001 - a failed renewal is tried again next period
                    logger.warning("renewing %d concurrency leases failed", len(self.leases), exc_info=True)

    async def _renew(self, expires: float) -> None:
        raise NotImplementedError


class RedisLimiter(_Leases):
    def __init__(self, url: str, group: GroupLimits, *, slot_ttl: float | None = None,
                 timeout: float | None = None, lease_seconds: float | None = None):
        import redis.asyncio as aioredis
        from django.conf import settings

        if timeout is None:
            timeout = getattr(settings, "GATEWAY_REDIS_TIMEOUT", DEFAULT_TIMEOUT)
        if lease_seconds is None:
            lease_seconds = getattr(settings, "GATEWAY_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)
        super().__init__(lease_seconds)
        self._timeout = timeout
        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        # Admission and release, on every request, on a client of their own (clawhub.core.resp: a tenth of
        # redis-py's CPU); redis-py keeps the lease renewals.
        self._calls = RespClient(url, timeout=timeout) if url.startswith("redis://") else None
        self._admit = Script(_ADMIT)
        self._release = Script(_RELEASE)
        self._group = group
        self._down_until = 0.0

    def _failed(self, part: str, exc: BaseException) -> None:
        REDIS_FAILURES.labels(part=part).inc()
        if time.monotonic() >= self._down_until:
            logger.warning("quota store unreachable (%s: %s); serving without limits", type(exc).__name__,
                           exc)
        self._down_until = time.monotonic() + REDIS_RETRY_AFTER

    async def close(self) -> None:
        await self._stop_renewing()
        if self._calls is not None:
            await self._calls.close()
        await self._redis.aclose()

    async def _bounded(self, call):
        """``call`` within the timeout: RespClient bounds each of its calls itself (asyncio.wait_for would
        cost more CPU than the call); redis-py's are bounded here."""
        if self._calls is not None:
            return await call
        return await asyncio.wait_for(call, self._timeout * 2)

    async def _script(self, script: Script, keys: list, args: list):
        if self._calls is not None:
            return await self._calls.evalsha(script, keys, args)
        # rediss:// and unix sockets: redis-py, which speaks them (EVAL: Redis caches the script by its SHA1).
        return await self._redis.eval(script.source, len(keys), *keys, *args)

    async def admit(self, info: KeyInfo, request_id: str, expected_generation: str | None, *,
                    reserve: int = 0, adapter: str | None = None,
                    adapter_generation: AdapterGeneration | None = None) -> tuple[bool, str]:
        """Counts the request if it is within every limit, reserving ``reserve`` tokens. Returns (True,
        generation) when admitted, (False, generation) when the key's cache generation moved on (nothing was
        counted); raises AdapterMoved when the tenant's adapter generation did (nothing counted either) and a
        429 GatewayError when a limit is reached. Redis not answering admits (fail open, counted) with
        generation None: nothing was checked."""
        if time.monotonic() < self._down_until:
            REDIS_FAILURES.labels(part="quota").inc()
            return True, None
        try:
            return await self._bounded(self._admit_redis(info, request_id, expected_generation, reserve,
                                                         adapter, adapter_generation))
        except (TimeoutError, OSError, self._errors()) as exc:
            self._failed("quota", exc)
            return True, None

    async def generation_moved(self, info: KeyInfo, expected_generation: str | None) -> bool:
        """Whether the key's cache generation differs from the one its lookup was made under (one GET, for
        the routes that take no admission). Redis not answering says no (fail open, counted)."""
        if expected_generation is None or time.monotonic() < self._down_until:
            return False
        try:
            value = await asyncio.wait_for(self._redis.get(info.generation_key), self._timeout * 2)
        except (TimeoutError, OSError, self._errors()) as exc:
            self._failed("quota", exc)
            return False
        return (value.decode() if value is not None else ABSENT) != expected_generation

    @staticmethod
    def _errors() -> type[Exception]:
        import redis

        return redis.RedisError

    async def _admit_redis(self, info: KeyInfo, request_id: str, expected_generation: str | None,
                           reserve: int, adapter: str | None,
                           adapter_generation: AdapterGeneration | None) -> tuple[bool, str]:
        now = time.time()
        minute = int(now // 60)
        k, g, busy = _names(info, minute, adapter)
        group = self._group
        result = await self._script(
            self._admit,
            [f"{k}:rpm:{minute}", f"{k}:tpm:{minute}", f"{k}:conc",
             f"{g}:rpm:{minute}", f"{g}:tpm:{minute}", f"{g}:conc", info.generation_key, busy,
             adapter_generation.key if adapter_generation else "-"],
            [expected_generation or "", _lim(info.rpm), _lim(info.tpm), _lim(info.concurrency),
             _lim(group.rpm), _lim(group.tpm), _lim(group.concurrency),
             1 if info.group_id else 0, now, request_id, self.lease_seconds, WINDOW_TTL, reserve,
             1 if adapter else 0, adapter_generation.expected if adapter_generation else ""],
        )
        code = int(result[0])
        generation = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        if code == -1:
            return False, generation
        if code == -2:
            raise AdapterMoved
        if code:
            raise _limited(code, now)
        grp = bool(info.group_id)
        self.leases[request_id] = Lease(
            keys=(f"{k}:conc", *((f"{g}:conc",) if grp else ()), *((busy,) if adapter else ())),
            tpm_keys=(f"{k}:tpm:{minute}", *((f"{g}:tpm:{minute}",) if grp else ())),
            reserve=reserve, group=grp, adapter_key=busy if adapter else "")
        return True, generation

    async def release(self, info: KeyInfo, request_id: str, tokens: int) -> None:
        """Frees the request's leases and settles its reservation to ``tokens``, the real usage."""
        lease = self.leases.pop(request_id, None)
        if time.monotonic() < self._down_until:
            REDIS_FAILURES.labels(part="quota_release").inc()
            return  # the lease expires on its own within lease_seconds
        try:
            await self._bounded(self._release_redis(info, request_id, tokens, lease))
        except (TimeoutError, OSError, self._errors()) as exc:
            self._failed("quota_release", exc)

    async def _release_redis(self, info: KeyInfo, request_id: str, tokens: int, lease: Lease | None) -> None:
        if lease is None:  # admitted while Redis was away: nothing was reserved, the tokens still count
            minute = int(time.time() // 60)
            k, g, _ = _names(info, minute, None)
            grp = bool(info.group_id)
            lease = Lease(keys=(f"{k}:conc", *((f"{g}:conc",) if grp else ())),
                          tpm_keys=(f"{k}:tpm:{minute}", *((f"{g}:tpm:{minute}",) if grp else ())),
                          reserve=0, group=grp, adapter_key="")
        group_conc = lease.keys[1] if lease.group else "-"
        group_tpm = lease.tpm_keys[1] if lease.group else "-"
        await self._script(
            self._release,
            [lease.keys[0], lease.tpm_keys[0], group_conc, group_tpm, lease.adapter_key or "-"],
            [request_id, tokens - lease.reserve, 1 if lease.group else 0, 1 if lease.adapter_key else 0,
             WINDOW_TTL])

    async def _renew(self, expires: float) -> None:
        if time.monotonic() < self._down_until:
            return
        pipe = self._redis.pipeline(transaction=False)
        keys = set()
        for request_id, lease in list(self.leases.items()):
            for key in lease.keys:
                pipe.zadd(key, {request_id: expires}, xx=True)
                keys.add(key)
        for key in keys:  # the set lives as long as its last lease
            pipe.expire(key, math.ceil(self.lease_seconds) + 1)
        try:
            await asyncio.wait_for(pipe.execute(), self._timeout * 4)
        except (TimeoutError, OSError, self._errors()) as exc:
            self._failed("quota_renew", exc)


class LocalLimiter(_Leases):
    """The same rules for a single process without Redis. Key generations are read from Django's cache (the
    embedded stack's file cache, which every process of it shares): one small file read per request."""

    def __init__(self, group: GroupLimits, *, slot_ttl: float | None = None,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS):
        super().__init__(lease_seconds)
        self._group = group
        self._windows: dict[tuple, int] = {}
        self._slots: dict[str, dict[str, float]] = {}  # name -> request id -> when its lease expires
        self._minute = 0

    async def close(self) -> None:
        await self._stop_renewing()

    def _count(self, name: str, minute: int) -> int:
        return self._windows.get((name, minute), 0)

    def _slots_of(self, name: str, now: float) -> dict[str, float]:
        slots = self._slots.setdefault(name, {})
        for rid in [r for r, t in slots.items() if t < now]:
            del slots[rid]
        return slots

    async def admit(self, info: KeyInfo, request_id: str, expected_generation: str | None, *,
                    reserve: int = 0, adapter: str | None = None,
                    adapter_generation: AdapterGeneration | None = None) -> tuple[bool, str | None]:
        from clawhub.keys.cache import key_cache_generation_now

        generation = key_cache_generation_now(key_id=info.key_id)
        if expected_generation is not None and generation != expected_generation:
            return False, generation
        if adapter_generation is not None:
            from clawhub.adapters.cache import adapter_cache_generation_now

            now_at = adapter_cache_generation_now(tenant_id=adapter_generation.tenant_id)
            if now_at != adapter_generation.expected:
                raise AdapterMoved
        now = time.time()
        minute = int(now // 60)
        if minute != self._minute:  # old windows can go
            self._windows = {k: v for k, v in self._windows.items() if k[1] >= minute - 1}
            self._minute = minute
        k, g = f"k{info.key_id}", f"g{info.group_id}"
        names = [k, g] if info.group_id else [k]
        limits = [(info.rpm, info.tpm, info.concurrency, 0)]
        if info.group_id:
            limits.append((self._group.rpm, self._group.tpm, self._group.concurrency, 3))
        for name, (rpm, tpm, concurrency, offset) in zip(names, limits, strict=True):
            if rpm is not None and self._count(f"{name}:rpm", minute) >= rpm:
                raise _limited(1 + offset, now)
            if tpm is not None:
                if reserve > tpm:
                    raise _limited(7 if not offset else 8, now)
                used = self._count(f"{name}:tpm", minute)
                if used >= tpm or used + reserve > tpm:
                    raise _limited(2 + offset, now)
            if concurrency is not None and len(self._slots_of(name, now)) >= concurrency:
                raise _limited(3 + offset, now)
        expires = now + self.lease_seconds
        for name in names:
            self._windows[(f"{name}:rpm", minute)] = self._count(f"{name}:rpm", minute) + 1
            if reserve:
                self._windows[(f"{name}:tpm", minute)] = self._count(f"{name}:tpm", minute) + reserve
            self._slots_of(name, now)[request_id] = expires
        busy = f"busy:{adapter}" if adapter else ""
        if busy:
            self._slots_of(busy, now)[request_id] = expires
        self.leases[request_id] = Lease(keys=tuple(names) + ((busy,) if busy else ()),
                                        tpm_keys=tuple(f"{n}:tpm:{minute}" for n in names), reserve=reserve,
                                        group=bool(info.group_id), adapter_key=busy)
        return True, generation

    async def generation_moved(self, info: KeyInfo, expected_generation: str | None) -> bool:
        from clawhub.keys.cache import key_cache_generation_now

        return expected_generation is not None and key_cache_generation_now(key_id=info.key_id) != (
            expected_generation)

    async def release(self, info: KeyInfo, request_id: str, tokens: int) -> None:
        lease = self.leases.pop(request_id, None)
        minute = int(time.time() // 60)
        names = [f"k{info.key_id}", f"g{info.group_id}"] if info.group_id else [f"k{info.key_id}"]
        for name in (*names, *((lease.adapter_key,) if lease and lease.adapter_key else ())):
            self._slots.get(name, {}).pop(request_id, None)
        delta = tokens - (lease.reserve if lease else 0)
        if delta:
            window = int(lease.tpm_keys[0].rsplit(":", 1)[1]) if lease else minute
            for name in names:
                self._windows[(f"{name}:tpm", window)] = self._count(f"{name}:tpm", window) + delta

    def in_flight(self, adapter: str) -> int:
        return len(self._slots_of(f"busy:{adapter}", time.time()))

    async def _renew(self, expires: float) -> None:
        for request_id, lease in list(self.leases.items()):
            for name in lease.keys:
                slots = self._slots.get(name)
                if slots is not None and request_id in slots:
                    slots[request_id] = expires
