"""The background writer: takes TurnRecords off the hot path and persists them in batches.

A daemon thread wakes every INTERVAL seconds, drains a bounded queue (BATCH records at a time) and calls
``clawhub.conversations.capture.capture_store(batch)``. A failure is logged and counted, never raised: capture
must not affect serving. The same thread runs the gateway's other small writes (the upstream/adapter registry,
ApiKey.last_used_at), so the event loop never touches the database, and it also updates the per-request
Prometheus metrics from the records: the event loop does not pay for them either.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from clawhub.core import metrics
from clawhub.gateway.records import TurnRecord

logger = logging.getLogger("clawhub.gateway.capture")

BATCH = 200
INTERVAL = 0.2
LAST_USED_EVERY = 60.0  # seconds between last_used_at updates of one key

# Module-level counters the metrics endpoint exports.
STATS = {"submitted": 0, "stored": 0, "dropped": 0, "failed": 0, "failed_batches": 0, "op_failures": 0}


def default_store(batch: list[TurnRecord]) -> None:
    # Imported on first use: capture lives in another app and may not exist in every deployment stage.
    from clawhub.conversations.capture import capture_store

    capture_store(batch)


class RequestMeters:
    """The per-request metrics of one served /v1 completion, taken from its TurnRecord.

    Label children are cached: ``labels()`` costs more than the increment itself, and the label sets are few.
    """

    def __init__(self) -> None:
        self._requests: dict[tuple, Any] = {}
        self._timings: dict[tuple, tuple[Any, Any]] = {}
        self._tokens: dict[str, tuple[Any, Any]] = {}

    def observe(self, record: TurnRecord) -> None:
        model = metrics.model_label(record.model)
        key = (record.route, model, record.http_status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = metrics.GATEWAY_REQUESTS.labels(
                route=record.route, model=model, status=str(record.http_status))
        counter.inc()
        timing = self._timings.get((record.route, model))
        if timing is None:
            timing = self._timings[(record.route, model)] = (
                metrics.GATEWAY_REQUEST_DURATION.labels(route=record.route, model=model),
                metrics.GATEWAY_TIME_TO_FIRST_TOKEN.labels(route=record.route, model=model))
        timing[0].observe(record.latency_ms / 1000)
        if record.stream and record.ttft_ms is not None:
            timing[1].observe(record.ttft_ms / 1000)
        if record.prompt_tokens or record.completion_tokens:
            tokens = self._tokens.get(model)
            if tokens is None:
                tokens = self._tokens[model] = (metrics.GATEWAY_TOKENS.labels(kind="prompt", model=model),
                                                metrics.GATEWAY_TOKENS.labels(kind="completion", model=model))
            if record.prompt_tokens:
                tokens[0].inc(record.prompt_tokens)
            if record.completion_tokens:
                tokens[1].inc(record.completion_tokens)


class CaptureWriter:
    def __init__(self, *, store: Callable[[list[TurnRecord]], None] | None = None, maxsize: int = 20000,
                 batch: int = BATCH, interval: float = INTERVAL):
        self._store = store or default_store
        self._items: deque = deque()
        self._maxsize = maxsize
        self._stopping = threading.Event()
        self._batch, self._interval = batch, interval
        self._thread: threading.Thread | None = None
        self._last_used: dict[int, float] = {}
        self._meters = RequestMeters()

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="gateway-capture", daemon=True)
            self._thread.start()

    def submit(self, record: TurnRecord) -> bool:
        """Never blocks: when the queue is full the record is dropped and counted."""
        # A deque append, not queue.Queue.put: put() takes a lock and wakes the writer thread for every item,
        # and those wake-ups (GIL hand-overs included) cost the event loop more than the rest of the hand-off.
        # The writer polls instead. The size check races with the writer's pops, which can only make room.
        if len(self._items) >= self._maxsize:
            STATS["dropped"] += 1
            metrics.CAPTURE_FAILURES.labels(reason="queue_full").inc()
            self._meters.observe(record)  # the request was served all the same
            logger.warning("capture queue full; dropped turn %s", record.request_id)
            return False
        self._items.append(record)
        STATS["submitted"] += 1
        return True

    def submit_op(self, op: Callable[[], Any]) -> None:
        """A small database write to run on the writer thread (registry updates)."""
        if len(self._items) >= self._maxsize:
            STATS["op_failures"] += 1
            return
        self._items.append(op)

    def stop(self, timeout: float = 10.0) -> None:
        """Flushes what is queued, then ends the thread (lifespan shutdown)."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while True:
            # Sleeps a whole interval (stop() cuts it short), then takes everything queued, a batch at a time.
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
        from django.db import close_old_connections

        close_old_connections()
        for op in ops:
            try:
                op()
            except Exception:
                STATS["op_failures"] += 1
                logger.exception("gateway registry write failed")
        if not records:
            return
        for record in records:
            self._meters.observe(record)
        try:
            self._store(records)
            STATS["stored"] += len(records)
        except Exception as exc:
            STATS["failed"] += len(records)
            STATS["failed_batches"] += 1
            metrics.CAPTURE_FAILURES.labels(reason="write_error").inc(len(records))
            # Records carry no key material, only ids; the message is the exception's own.
            logger.error("capture_store failed for %d turns: %s: %s", len(records), type(exc).__name__, exc)
        self._touch_keys(records)

    def _touch_keys(self, records: list[TurnRecord]) -> None:
        now = time.monotonic()
        due = {r.key_id for r in records if now - self._last_used.get(r.key_id, -1e9) >= LAST_USED_EVERY}
        if not due:
            return
        from clawhub.gateway.services import api_keys_mark_used

        try:
            api_keys_mark_used(key_ids=sorted(due))
            self._last_used.update(dict.fromkeys(due, now))
        except Exception:
            STATS["op_failures"] += 1
            logger.exception("updating last_used_at failed")

    def _close_connections(self) -> None:
        from django.db import connections

        connections.close_all()
