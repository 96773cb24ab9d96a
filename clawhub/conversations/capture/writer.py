"""The gateway's side of capture: every finished TurnRecord goes to the durable hand-off (``capture.handoff``)
before the gateway forgets it, and the capture consumer (``capture.consumer``, its own process) stores it.

On the event loop, per request: ``begin(request_id)`` at admission and, when the reply is done,
``submit(record)``: one orjson encode and an append to an outbox. A sender task pipelines the outbox into the
Redis Stream (one round trip for everything that finished meanwhile) and only then closes the request's entry
in the in-flight journal. When Redis does not answer within CAPTURE_REDIS_TIMEOUT, or the stream is over its
byte or count bound (never trimmed: every entry in it is a turn not yet stored), records go to the local spool
instead (one ``write()``), and a housekeeping task forwards them once Redis is back. Without Redis the spool
is the log. A record is dropped only when the spool itself is full (counted, alarmed at 80 %).

``stop()`` (lifespan shutdown, after the server finished its open streams) hands every queued record to the
log before it returns. A thread runs what the serving process hands it besides capture, so the event loop pays
for none of it: small database writes (``submit_op``: the gateway's upstream/adapter registry) and its
``RecordObserver`` (the gateway's request metrics and ApiKey.last_used_at, clawhub.gateway.meters).

With ``store`` given (tests) or CAPTURE_CONSUMER_IN_PROCESS, the consumer runs as a thread of this process on
a stream and spool folder of this writer's own, so several gateways in one test process never share records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from clawhub.conversations.capture.handoff import HandoffSettings
from clawhub.conversations.capture.housekeeping import PIPELINE_BYTES, STATS, SpoolHousekeeping
from clawhub.conversations.capture.records import TurnRecord, encode
from clawhub.conversations.capture.spool import Spool
from clawhub.core import metrics
from clawhub.core.resp import RespClient

logger = logging.getLogger("clawhub.gateway.capture")

BATCH = 200
INTERVAL = 0.2
REDIS_RETRY_AFTER = 1.0  # after a failed Redis call, records go straight to the spool for this long


class RecordObserver(Protocol):
    """What the process that serves the records does with each one besides capture (the gateway: its request
    metrics and its keys' last use), on the writer's thread, so that the event loop pays for none of it."""

    def count(self, record: TurnRecord) -> None:
        """Cheap and without the database: also called on the event loop when the thread's queue is full."""

    def observe(self, records: list[TurnRecord]) -> None:
        """Once ``count`` has seen each of them, on the thread (which may use the database)."""


class CaptureWriter(SpoolHousekeeping):
    def __init__(self, *, store: Callable[[list[TurnRecord]], None] | None = None, maxsize: int = 20000,
                 batch: int = BATCH, interval: float = INTERVAL, handoff: HandoffSettings | None = None,
                 observer: RecordObserver | None = None):
        cfg = handoff or HandoffSettings.from_settings()
        self.instance = f"{os.urandom(5).hex()}{os.getpid():x}"
        self._in_process = store is not None or cfg.in_process
        if self._in_process:
            cfg = replace(cfg, stream=f"{cfg.stream}:{self.instance}",
                          spool_dir=cfg.spool_dir / self.instance, claim_idle=min(cfg.claim_idle, 2.0))
        self.cfg = cfg
        self._store = store
        self.spool = Spool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes)
        self._redis = None
        self._calls: RespClient | None = None
        self._outbox: deque[tuple[str, bytes]] = deque()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._redis_down_until = 0.0
        self._over_bytes = False
        self._alarmed = False
        self._sending = False
        # The metering/registry thread.
        self._items: deque = deque()
        self._maxsize = maxsize
        self._stopping = threading.Event()
        self._batch, self._interval = batch, interval
        self._thread: threading.Thread | None = None
        self._observer = observer
        self._consumer = None
        self._consumer_thread: threading.Thread | None = None
        self._consumer_stop = threading.Event()
        self._opened = False

    # --- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="gateway-capture", daemon=True)
        self._thread.start()
        self.spool.open_writer(self.instance)
        self._opened = True
        if self.cfg.redis_url:
            import redis.asyncio as aioredis

            self._redis = aioredis.Redis.from_url(
                self.cfg.redis_url, socket_timeout=self.cfg.redis_timeout,
                socket_connect_timeout=self.cfg.redis_timeout)
            if self.cfg.redis_url.startswith("redis://"):
                # Every request's XADD through clawhub.core.resp (a fraction of redis-py's CPU).
                self._calls = RespClient(self.cfg.redis_url, timeout=self.cfg.redis_timeout * 2)
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # no event loop (a unit test): submit() spools directly
        if self._loop is not None:
            self._wake = asyncio.Event()
            self._tasks = [self._loop.create_task(self._sender(), name="capture-sender"),
                           self._loop.create_task(self._housekeeping(), name="capture-housekeeping")]
        if self._in_process:
            from clawhub.conversations.capture.consumer import CaptureConsumer

            self._consumer = CaptureConsumer(self.cfg, store=self._store)
            self._consumer_stop.clear()
            self._consumer_thread = threading.Thread(target=self._consumer.run, args=(self._consumer_stop,),
                                                     name="capture-consumer", daemon=True)
            self._consumer_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Hands everything queued to the log, then ends the tasks and threads (lifespan shutdown; may run in
        a worker thread while the event loop still runs)."""
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        loop = self._loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            future = asyncio.run_coroutine_threadsafe(self._shutdown_tasks(), loop)
            try:
                future.result(max(0.1, deadline - time.monotonic()))
            except Exception:
                logger.exception("capture hand-off did not finish cleanly; spooling what is left")
        self._spool_outbox()
        if self._consumer is not None:
            self._consumer.drain(max(0.1, deadline - time.monotonic()))
            self._consumer_stop.set()
            self._consumer_thread.join(max(0.1, deadline - time.monotonic()) + 5)
            self._consumer.close()
        self._stopping.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        self._thread = None
        if self._opened:
            self.spool.close_writer()
            self._opened = False
        if self._in_process and self.cfg.redis_url:
            self._forget_own_stream()

    async def aclose(self) -> None:
        """The async form of stop() for callers on the event loop; stop() runs even if the hand-off raised."""
        try:
            await self._shutdown_tasks()
        finally:
            await asyncio.to_thread(self.stop)

    async def _shutdown_tasks(self) -> None:
        if self._tasks:
            tasks, self._tasks = self._tasks, []
            tasks[1].cancel()  # housekeeping
            try:
                await self._flush_outbox(final=True)
                if self._redis is not None and time.monotonic() >= self._redis_down_until:
                    await self._forward_spool(final=True)
            finally:
                tasks[0].cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            # What the sender had taken when it was cancelled is back in the outbox.
            await self._flush_outbox(final=True)
        if self._calls is not None:
            await self._calls.close()
            self._calls = None
        if self._redis is not None:
            try:
                await self._redis.aclose()
            except Exception:
                pass
            self._redis = None

    # --- the hot path ---------------------------------------------------------------------------------------
    def begin(self, request_id: str) -> None:
        """The request was admitted: it is in flight until its record is handed off."""
        if self._opened:
            self.spool.begin(request_id)

    def submit(self, record: TurnRecord) -> bool:
        """Never blocks on the network: the record is queued for the stream, or appended to the spool."""
        STATS["submitted"] += 1
        payload = encode(record)
        if (self._redis is not None and self._wake is not None and not self._over_bytes
                and time.monotonic() >= self._redis_down_until):
            self._outbox.append((record.request_id, payload))
            if not self._sending:
                self._wake.set()
            ok = True
        else:
            ok = self._spool_one(record.request_id, payload)
        self._meter(record)
        return ok

    def _meter(self, record: TurnRecord) -> None:
        # A deque append, not queue.Queue.put: put() takes a lock and wakes the thread for every item. The
        # size check races with the thread's pops, which can only make room.
        if len(self._items) >= self._maxsize:
            if self._observer is not None:
                self._observer.count(record)
        else:
            self._items.append(record)

    def _spool_one(self, request_id: str, payload: bytes) -> bool:
        if not self._opened:
            self._dropped(request_id, "not_started")
            return False
        if not self.spool.append(payload):
            self._dropped(request_id, "spool_full")
            self.spool.end(request_id)
            return False
        STATS["spooled"] += 1
        metrics.CAPTURE_HANDOFFS.labels(path="spool").inc()
        if self._over_bytes and self._redis is not None:
            metrics.CAPTURE_STREAM_FULL.inc()
        self.spool.end(request_id)
        return True

    def _dropped(self, request_id: str, reason: str) -> None:
        STATS["dropped"] += 1
        metrics.CAPTURE_FAILURES.labels(reason=reason).inc()
        logger.error("capture hand-off full (%s); turn %s is lost", reason, request_id)

    def submit_op(self, op: Callable[[], Any]) -> bool:
        """A small database write to run on the writer thread (registry updates); False: dropped (full)."""
        if len(self._items) >= self._maxsize:
            STATS["op_failures"] += 1
            return False
        self._items.append(op)
        return True

    # --- to Redis -------------------------------------------------------------------------------------------
    async def _sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._flush_outbox()

    async def _flush_outbox(self, final: bool = False) -> None:
        self._sending = True
        try:
            while self._outbox:
                taken: list[tuple[str, bytes]] = []
                size = 0
                while self._outbox and size < PIPELINE_BYTES:
                    item = self._outbox.popleft()
                    taken.append(item)
                    size += len(item[1])
                if self._redis is None or time.monotonic() < self._redis_down_until or self._over_bytes:
                    for rid, payload in taken:
                        self._spool_one(rid, payload)
                    continue
                try:
                    sent = await self._xadd(taken, size)
                except asyncio.CancelledError:
                    # Cancelled mid-call (shutdown): the batch goes back to the front of the outbox, to be
                    # handed off again or spooled by stop(). It may have reached the stream as well: stored
                    # once all the same (by request id), where dropping it could lose it.
                    self._outbox.extendleft(reversed(taken))
                    raise
                if not sent:
                    for rid, payload in taken:
                        self._spool_one(rid, payload)
                    continue
                STATS["streamed"] += len(taken)
                metrics.CAPTURE_HANDOFFS.labels(path="stream").inc(len(taken))
                for rid, _ in taken:
                    self.spool.end(rid)
        finally:
            self._sending = False

    async def _xadd(self, items: list[tuple[str, bytes]], size: int) -> bool:
        cfg = self.cfg
        if self._calls is not None:
            commands = [("XADD", cfg.stream, "*", "r", payload) for _, payload in items]
            commands += [("INCRBY", cfg.bytes_key, size), ("XLEN", cfg.stream)]
            try:
                results = await self._calls.call_many(commands)  # bounded by the client's own timeout
                if failed := next((r for r in results if isinstance(r, Exception)), None):
                    raise failed
            except Exception as exc:
                self._redis_failed(exc)
                return False
            self._note_bytes(int(results[-2]), int(results[-1]))
            return True
        pipe = self._redis.pipeline(transaction=False)
        for _, payload in items:
            pipe.xadd(cfg.stream, {"r": payload})
        pipe.incrby(cfg.bytes_key, size)
        pipe.xlen(cfg.stream)
        try:
            results = await asyncio.wait_for(pipe.execute(), cfg.redis_timeout * 2)
        except Exception as exc:
            self._redis_failed(exc)
            return False
        self._note_bytes(int(results[-2]), int(results[-1]))
        return True

    def _note_bytes(self, total: int, length: int) -> None:
        # The stream is never trimmed (XADD MAXLEN would drop turns no consumer has stored): past either bound
        # the next records wait in the local spool until the backlog is well under it again.
        cfg = self.cfg
        over = total > cfg.max_bytes or length > cfg.maxlen
        if over != self._over_bytes:
            self._over_bytes = over
            if over:
                logger.error("capture stream %s holds %d records and %d bytes, over its bound (%d records, "
                             "%d bytes): spooling locally", cfg.stream, length, total, cfg.maxlen,
                             cfg.max_bytes)
        alarm = total > cfg.max_bytes * cfg.alarm_ratio
        if alarm and not self._alarmed:
            logger.warning("capture stream %s backlog is %d bytes (alarm at %.0f%% of %d): is the capture "
                           "consumer running?", cfg.stream, total, cfg.alarm_ratio * 100, cfg.max_bytes)
        self._alarmed = alarm

    def _redis_failed(self, exc: BaseException) -> None:
        if time.monotonic() >= self._redis_down_until:
            logger.warning("capture stream unreachable (%s: %s); spooling locally", type(exc).__name__, exc)
        metrics.REDIS_FAILURES.labels(part="capture").inc()
        self._redis_down_until = time.monotonic() + REDIS_RETRY_AFTER

    def _spool_outbox(self) -> None:
        while self._outbox:
            rid, payload = self._outbox.popleft()
            self._spool_one(rid, payload)

    def _forget_own_stream(self) -> None:
        import redis

        client = redis.Redis.from_url(self.cfg.redis_url, socket_timeout=self.cfg.redis_timeout)
        try:
            client.delete(self.cfg.stream, self.cfg.dead_stream, self.cfg.bytes_key, self.cfg.stats_key)
        except redis.RedisError:
            pass
        finally:
            client.close()

    # --- the thread: the observer and the small registry writes ---------------------------------------------
    def _run(self) -> None:
        while True:
            stopping = self._stopping.wait(self._interval)
            while self._items:
                records: list[TurnRecord] = []
                ops: list[Callable[[], Any]] = []
                while self._items and len(records) < self._batch:
                    item = self._items.popleft()
                    if isinstance(item, TurnRecord):
                        records.append(item)
                    else:
                        ops.append(item)
                self._flush(records, ops)
            if stopping:
                break
        self._close_connections()

    def _flush(self, records: list[TurnRecord], ops: list[Callable[[], Any]]) -> None:
        if self._observer is not None:
            for record in records:
                self._observer.count(record)
        if not ops and not records:
            return
        from django.db import close_old_connections

        close_old_connections()
        for op in ops:
            try:
                op()
            except Exception as exc:
                # The database may be down: the registry is written again at the next sync or health change.
                STATS["op_failures"] += 1
                logger.warning("gateway registry write failed: %s: %s", type(exc).__name__, exc)
        if records and self._observer is not None:
            self._observer.observe(records)

    def _close_connections(self) -> None:
        from django.db import connections

        connections.close_all()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
