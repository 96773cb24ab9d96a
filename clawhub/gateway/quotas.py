"""Per-key and per-group quotas: requests/min, tokens/min, concurrent requests.

Admission is ONE Redis round trip (a Lua script): it checks the key's cache generation, the fixed one-minute
windows for rpm and tpm and the concurrency sets, and only then counts the request. Tokens are added when the
response is done (from the usage chunk, or an estimate for a cut stream), together with the concurrency
release, in a second round trip that the client never waits for. A concurrency slot is a member of a sorted
set scored by its start time, so a slot leaked by a crashed process expires on its own.

Every Redis call is bounded (GATEWAY_REDIS_TIMEOUT). When Redis does not answer in time the request is
admitted without limits (fail open: agents keep working) and counted in
``clawhub_redis_failures{part="quota"}``; for REDIS_RETRY_AFTER seconds after a failure admission does not
even try, so an outage costs no request more than one timeout.

Without Redis (the embedded default) ``LocalLimiter`` applies the same rules inside the process.
"""

import asyncio
import logging
import time
from dataclasses import dataclass

from clawhub.core.metrics import QUOTA_REJECTIONS, REDIS_FAILURES
from clawhub.gateway.auth import KeyInfo
from clawhub.gateway.errors import rate_limited

WINDOW_TTL = 120  # a minute's counters live a little longer than their minute
REDIS_RETRY_AFTER = 1.0
DEFAULT_TIMEOUT = 0.25

logger = logging.getLogger("clawhub.gateway.quotas")

_ADMIT = """
local gen = redis.call('GET', KEYS[7]) or '0'
if ARGV[1] ~= '' and ARGV[1] ~= gen then return {-1, gen} end
local now = tonumber(ARGV[9])
local cttl = tonumber(ARGV[11])
local function over(limit, key)
  if limit < 0 then return false end
  return tonumber(redis.call('GET', key) or '0') >= limit
end
local function conc_over(limit, key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - cttl)
  if limit < 0 then return false end
  return redis.call('ZCARD', key) >= limit
end
if over(tonumber(ARGV[2]), KEYS[1]) then return {1, gen} end
if over(tonumber(ARGV[3]), KEYS[2]) then return {2, gen} end
if conc_over(tonumber(ARGV[4]), KEYS[3]) then return {3, gen} end
local grp = ARGV[8] == '1'
if grp then
  if over(tonumber(ARGV[5]), KEYS[4]) then return {4, gen} end
  if over(tonumber(ARGV[6]), KEYS[5]) then return {5, gen} end
  if conc_over(tonumber(ARGV[7]), KEYS[6]) then return {6, gen} end
end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[12])
redis.call('ZADD', KEYS[3], now, ARGV[10])
redis.call('EXPIRE', KEYS[3], cttl)
if grp then
  redis.call('INCR', KEYS[4])
  redis.call('EXPIRE', KEYS[4], ARGV[12])
  redis.call('ZADD', KEYS[6], now, ARGV[10])
  redis.call('EXPIRE', KEYS[6], cttl)
end
return {0, gen}
"""

_REASONS = {  # code: (message, how Retry-After is found, the QUOTA_REJECTIONS label)
    1: ("Requests per minute limit reached for this key.", "window", "rpm"),
    2: ("Tokens per minute limit reached for this key.", "window", "tpm"),
    3: ("Too many concurrent requests for this key.", "slot", "concurrency"),
    4: ("Requests per minute limit reached for this group.", "window", "group_rpm"),
    5: ("Tokens per minute limit reached for this group.", "window", "group_tpm"),
    6: ("Too many concurrent requests for this group.", "slot", "group_concurrency"),
}


@dataclass(frozen=True, slots=True)
class GroupLimits:
    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None


def _limited(reason: int, now: float):
    message, kind, limit = _REASONS[reason]
    QUOTA_REJECTIONS.labels(limit=limit).inc()
    retry_after = 60 - int(now % 60) if kind == "window" else 1
    return rate_limited(message, retry_after)


def _lim(value: int | None) -> int:
    return -1 if value is None else value


class RedisLimiter:
    def __init__(self, url: str, group: GroupLimits, *, slot_ttl: float, timeout: float | None = None):
        import redis.asyncio as aioredis

        if timeout is None:
            from django.conf import settings

            timeout = getattr(settings, "GATEWAY_REDIS_TIMEOUT", DEFAULT_TIMEOUT)
        self._timeout = timeout
        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._admit = self._redis.register_script(_ADMIT)
        self._group, self._slot_ttl = group, int(slot_ttl) + 60
        self._down_until = 0.0

    def _failed(self, part: str, exc: BaseException) -> None:
        REDIS_FAILURES.labels(part=part).inc()
        if time.monotonic() >= self._down_until:
            logger.warning("quota store unreachable (%s: %s); serving without limits", type(exc).__name__,
                           exc)
        self._down_until = time.monotonic() + REDIS_RETRY_AFTER

    async def close(self) -> None:
        await self._redis.aclose()

    async def admit(self, info: KeyInfo, request_id: str,
                    expected_generation: str | None) -> tuple[bool, str]:
        """Counts the request if it is within every limit. Returns (True, generation) when admitted,
        (False, generation) when the key's cache generation moved on (nothing was counted);
        raises a 429 GatewayError when a limit is reached. Redis not answering admits (fail open, counted)."""
        if time.monotonic() < self._down_until:
            REDIS_FAILURES.labels(part="quota").inc()
            return True, expected_generation or ""
        try:
            return await asyncio.wait_for(self._admit_redis(info, request_id, expected_generation),
                                          self._timeout * 2)
        except (TimeoutError, OSError, self._errors()) as exc:
            self._failed("quota", exc)
            return True, expected_generation or ""

    @staticmethod
    def _errors() -> type[Exception]:
        import redis

        return redis.RedisError

    async def _admit_redis(self, info: KeyInfo, request_id: str,
                           expected_generation: str | None) -> tuple[bool, str]:
        now = time.time()
        minute = int(now // 60)
        k, g = f"gw:q:k{info.key_id}", f"gw:q:g{info.group_id}"
        group = self._group
        result = await self._admit(
            keys=[f"{k}:rpm:{minute}", f"{k}:tpm:{minute}", f"{k}:conc",
                  f"{g}:rpm:{minute}", f"{g}:tpm:{minute}", f"{g}:conc", info.generation_key],
            args=[expected_generation or "", _lim(info.rpm), _lim(info.tpm), _lim(info.concurrency),
                  _lim(group.rpm), _lim(group.tpm), _lim(group.concurrency),
                  1 if info.group_id else 0, now, request_id, self._slot_ttl, WINDOW_TTL],
        )
        code = int(result[0])
        generation = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        if code == -1:
            return False, generation
        if code:
            raise _limited(code, now)
        return True, generation

    async def release(self, info: KeyInfo, request_id: str, tokens: int) -> None:
        if time.monotonic() < self._down_until:
            REDIS_FAILURES.labels(part="quota_release").inc()
            return  # the slot expires on its own (slot_ttl)
        try:
            await asyncio.wait_for(self._release_redis(info, request_id, tokens), self._timeout * 2)
        except (TimeoutError, OSError, self._errors()) as exc:
            self._failed("quota_release", exc)

    async def _release_redis(self, info: KeyInfo, request_id: str, tokens: int) -> None:
        minute = int(time.time() // 60)
        k, g = f"gw:q:k{info.key_id}", f"gw:q:g{info.group_id}"
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrem(f"{k}:conc", request_id)
        if tokens:
            pipe.incrby(f"{k}:tpm:{minute}", tokens)
            pipe.expire(f"{k}:tpm:{minute}", WINDOW_TTL)
        if info.group_id:
            pipe.zrem(f"{g}:conc", request_id)
            if tokens:
                pipe.incrby(f"{g}:tpm:{minute}", tokens)
                pipe.expire(f"{g}:tpm:{minute}", WINDOW_TTL)
        await pipe.execute()


class LocalLimiter:
    """The same rules for a single process without Redis. Generations are not tracked: key lookups expire."""

    def __init__(self, group: GroupLimits, *, slot_ttl: float):
        self._group, self._slot_ttl = group, slot_ttl + 60
        self._windows: dict[tuple, int] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._minute = 0

    async def close(self) -> None:
        pass

    def _count(self, name: str, minute: int) -> int:
        return self._windows.get((name, minute), 0)

    def _slots_of(self, name: str, now: float) -> dict[str, float]:
        slots = self._slots.setdefault(name, {})
        for rid in [r for r, t in slots.items() if t < now - self._slot_ttl]:
            del slots[rid]
        return slots

    async def admit(self, info: KeyInfo, request_id: str,
                    expected_generation: str | None) -> tuple[bool, None]:
        now = time.time()
        minute = int(now // 60)
        if minute != self._minute:  # old windows can go
            self._windows = {k: v for k, v in self._windows.items() if k[1] >= minute - 1}
            self._minute = minute
        k, g = f"k{info.key_id}", f"g{info.group_id}"
        checks = [(info.rpm, self._count(f"{k}:rpm", minute), 1),
                  (info.tpm, self._count(f"{k}:tpm", minute), 2),
                  (info.concurrency, len(self._slots_of(k, now)), 3)]
        if info.group_id:
            group = self._group
            checks += [(group.rpm, self._count(f"{g}:rpm", minute), 4),
                       (group.tpm, self._count(f"{g}:tpm", minute), 5),
                       (group.concurrency, len(self._slots_of(g, now)), 6)]
        for limit, used, code in checks:
            if limit is not None and used >= limit:
                raise _limited(code, now)
        for name in [k, g] if info.group_id else [k]:
            self._windows[(f"{name}:rpm", minute)] = self._count(f"{name}:rpm", minute) + 1
            self._slots_of(name, now)[request_id] = now
        return True, None

    async def release(self, info: KeyInfo, request_id: str, tokens: int) -> None:
        minute = int(time.time() // 60)
        for name in [f"k{info.key_id}", f"g{info.group_id}"] if info.group_id else [f"k{info.key_id}"]:
            self._slots.get(name, {}).pop(request_id, None)
            if tokens:
                self._windows[(f"{name}:tpm", minute)] = self._count(f"{name}:tpm", minute) + tokens
