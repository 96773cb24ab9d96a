"""The durable hand-off between serving a reply and storing it: where a finished TurnRecord waits for the
capture consumer (``capture.consumer``), and how both sides read and write it.

Two logs, one record format (``capture.records``):

- **Redis Stream** (production, whenever ``REDIS_URL`` is set). The gateway XADDs each finished record (one
  pipelined round trip for whatever finished in the same moment). The consumer reads it in a consumer group,
  writes to the database idempotently by request id, and only then XACKs and XDELs, so the stream's length
  *is* the backlog and a crashed consumer's entries are claimed again. Hence no ``MAXLEN`` and no trim: every
  entry is a turn not yet stored.
  Chosen over a spool on every host because it is shared: any consumer replica drains any gateway pod, a pod
  that is deleted takes nothing with it, and Redis is already on every request's path (quotas). It needs AOF
  persistence (deploy/ runs Redis with ``--appendonly yes --appendfsync everysec``; the loss window on a Redis
  crash that this leaves is stated and measured in deploy/README.md, ``manage.py bench_handoff``). The stream
  is bounded by *bytes* too: a counter next to it (``<stream>:bytes``) is raised by every XADD and lowered by
  every acknowledgement, and while it is above ``CAPTURE_MAX_BYTES`` (or the stream longer than
  ``CAPTURE_STREAM_MAXLEN`` entries) the gateway spools locally instead (4 MiB bodies make a count bound alone
  meaningless).
- **Spool** (``capture.spool``; the embedded default, no Redis; and every gateway's fallback while Redis is
  unreachable or over its bound). Append-only segment files in ``CAPTURE_SPOOL_DIR``, one writer process per
  file, frames of ``length, crc32, time, payload``. Chosen over a SQLite spool because an append is one
  ``write()`` on the event loop (tens of microseconds even for a 90 KB body, no lock shared with the consumer
  or the main SQLite database) and a torn last frame after a crash is recognised by its length and checksum. A
  ``write()`` is in the kernel once it returns, so a killed process loses nothing it appended; ``fdatasync``
  runs off the event loop at most every ``SYNC_INTERVAL`` seconds, which bounds what a power loss can take.
  The gateway forwards spooled records to the stream once Redis is back; without Redis the consumer reads the
  spool itself.

Each gateway process also keeps an **in-flight journal** in the spool folder (``+id`` when a request is
admitted, ``-id`` once its record is handed off; the same cheap ``write()``), and holds an ``flock`` on its
lock file while it lives. Whoever next opens the folder and finds a lock nobody holds (the process crashed or
was killed) forwards or consumes that process's segments and counts the ids the journal left open: those are
the requests that were in flight at the crash, reported in the log and as ``clawhub_capture_lost_in_flight``
(a scrape-time gauge of the counter in the log's stats).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawhub.conversations.capture.spool import Spool, spool_stats

# --- settings -----------------------------------------------------------------------------------------------


@dataclass
class HandoffSettings:
    redis_url: str  # empty: the spool is the log
    stream: str
    spool_dir: Path
    max_bytes: int  # the stream's byte bound; above it the gateway spools
    maxlen: int  # the stream's count bound (spool above it; never a trim), far above what max_bytes allows
    spool_max_bytes: int  # above this a record is dropped and counted: the only way capture loses a turn
    alarm_ratio: float  # backlog above this share of a bound is logged and shown as an alarm in /metrics
    redis_timeout: float  # every Redis call of the hand-off
    batch_records: int
    # How long the consumer waits for more records when a read finds fewer than a batch: at steady load a
    # read finds one or two, and a batch costs about ten queries and three Redis calls whatever its size.
    batch_linger: float
    batch_bytes: int
    max_attempts: int  # deliveries of one record while the database answers, before it goes to dead letters
    claim_idle: float  # seconds before another consumer takes over a record a dead consumer had read
    in_process: bool  # the consumer runs as a thread of the gateway (tests), on a stream of its own

    @property
    def dead_stream(self) -> str:
        return f"{self.stream}:dead"

    @property
    def bytes_key(self) -> str:
        return f"{self.stream}:bytes"

    @property
    def stats_key(self) -> str:
        return f"{self.stream}:stats"

    @property
    def group(self) -> str:
        return "capture"

    @classmethod
    def from_settings(cls, **overrides: Any) -> HandoffSettings:
        from django.conf import settings

        values = dict(
            redis_url=settings.REDIS_URL,
            stream=settings.CAPTURE_STREAM,
            spool_dir=Path(settings.CAPTURE_SPOOL_DIR),
            max_bytes=settings.CAPTURE_MAX_BYTES,
            maxlen=settings.CAPTURE_STREAM_MAXLEN,
            spool_max_bytes=settings.CAPTURE_SPOOL_MAX_BYTES,
            alarm_ratio=settings.CAPTURE_ALARM_RATIO,
            redis_timeout=settings.CAPTURE_REDIS_TIMEOUT,
            batch_records=settings.CAPTURE_BATCH_RECORDS,
            batch_linger=settings.CAPTURE_BATCH_LINGER_MS / 1000,
            batch_bytes=settings.CAPTURE_BATCH_BYTES,
            max_attempts=settings.CAPTURE_MAX_ATTEMPTS,
            claim_idle=settings.CAPTURE_CLAIM_IDLE_SECONDS,
            in_process=settings.CAPTURE_CONSUMER_IN_PROCESS,
        )
        values.update(overrides)
        return cls(**values)


# --- what /metrics and /readyz report -----------------------------------------------------------------------

STAT_NAMES = ("stored", "retries", "dead_letters", "lost_in_flight", "forwarded")


def handoff_state(cfg: HandoffSettings | None = None) -> dict[str, Any]:
    """The log's state as the consumer sees it, read at scrape time (any process can answer it).

    backlog: records waiting (not yet stored); pending: read by a consumer but not yet acknowledged; lag:
    age in seconds of the oldest waiting record; spool_bytes: this host's local spool; heartbeat_age: seconds
    since a consumer last reported (None: never).
    """
    cfg = cfg or HandoffSettings.from_settings()
    state: dict[str, Any] = {"backend": "redis" if cfg.redis_url else "spool"}
    spool = Spool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes)
    state["spool_bytes"] = spool.rescan() if cfg.spool_dir.is_dir() else 0
    state["spool_max_bytes"] = cfg.spool_max_bytes
    if cfg.redis_url:
        import redis

        client = redis.Redis.from_url(cfg.redis_url, socket_timeout=cfg.redis_timeout,
                                      socket_connect_timeout=cfg.redis_timeout)
        try:
            pipe = client.pipeline(transaction=False)
            pipe.xlen(cfg.stream)
            pipe.get(cfg.bytes_key)
            pipe.hgetall(cfg.stats_key)
            pipe.xlen(cfg.dead_stream)
            pipe.xrange(cfg.stream, count=1)
            length, size, stats, dead, first = pipe.execute()
            try:
                pending = client.xpending(cfg.stream, cfg.group)["pending"]
            except redis.ResponseError:  # no group yet: no consumer has started
                pending = 0
        finally:
            client.close()
        stats = {k.decode(): float(v) for k, v in (stats or {}).items()}
        state.update(backlog=int(length), backlog_bytes=max(0, int(size or 0)), pending=int(pending),
                     dead_letters=int(dead), max_bytes=cfg.max_bytes, maxlen=cfg.maxlen)
        oldest = int(first[0][0].split(b"-")[0]) / 1000 if first else None
    else:
        stats = spool_stats(cfg.spool_dir)
        backlog = 0
        for instance in spool.instances():
            for segment in instance.segments:
                backlog += max(0, spool.size(segment) - spool.acked(segment))
        state.update(backlog_bytes=backlog, max_bytes=cfg.spool_max_bytes,
                     dead_letters=int(stats.get("dead_letters", 0)))
        oldest = spool.oldest_unacked()
    spooled_oldest = None if not cfg.redis_url else spool.oldest_unacked()
    if spooled_oldest is not None:
        oldest = spooled_oldest if oldest is None else min(oldest, spooled_oldest)
    state["lag_seconds"] = max(0.0, time.time() - oldest) if oldest else 0.0
    for name in STAT_NAMES:
        if name != "dead_letters" or "dead_letters" not in state:
            state[name] = stats.get(name, 0)
    beat = stats.get("heartbeat")
    state["heartbeat_age"] = None if not beat else max(0.0, time.time() - beat)
    return state
