"""The background writer: takes TurnRecords off the hot path and persists them in batches.

A daemon thread drains a bounded queue (up to BATCH records or INTERVAL seconds) and calls
``clawhub.conversations.capture.capture_store(batch)``. A failure is logged and counted, never raised: capture
must not affect serving. The same thread runs the gateway's other small writes (the upstream/adapter registry,
ApiKey.last_used_at), so the event loop never touches the database.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from clawhub.gateway.records import TurnRecord

logger = logging.getLogger("clawhub.gateway.capture")

BATCH = 200
INTERVAL = 0.2
LAST_USED_EVERY = 60.0  # seconds between last_used_at updates of one key

# Module-level counters the metrics endpoint exports.
STATS = {"submitted": 0, "stored": 0, "dropped": 0, "failed": 0, "failed_batches": 0, "op_failures": 0}

_STOP = object()


def default_store(batch: list[TurnRecord]) -> None:
    # Imported on first use: capture lives in another app and may not exist in every deployment stage.
    from clawhub.conversations.capture import capture_store

    capture_store(batch)


class CaptureWriter:
    def __init__(self, *, store: Callable[[list[TurnRecord]], None] | None = None, maxsize: int = 20000,
                 batch: int = BATCH, interval: float = INTERVAL):
        self._store = store or default_store
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._batch, self._interval = batch, interval
        self._thread: threading.Thread | None = None
        self._last_used: dict[int, float] = {}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gateway-capture", daemon=True)
            self._thread.start()

    def submit(self, record: TurnRecord) -> bool:
        """Never blocks: when the queue is full the record is dropped and counted."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            STATS["dropped"] += 1
            logger.warning("capture queue full; dropped turn %s", record.request_id)
            return False
        STATS["submitted"] += 1
        return True

    def submit_op(self, op: Callable[[], Any]) -> None:
        """A small database write to run on the writer thread (registry updates)."""
        try:
            self._queue.put_nowait(op)
        except queue.Full:
            STATS["op_failures"] += 1

    def stop(self, timeout: float = 10.0) -> None:
        """Flushes what is queued, then ends the thread (lifespan shutdown)."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        stopping = False
        while not stopping:
            records: list[TurnRecord] = []
            ops: list[Callable[[], Any]] = []
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            deadline = time.monotonic() + self._interval
            while True:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, TurnRecord):
                    records.append(item)
                else:
                    ops.append(item)
                if len(records) >= self._batch:
                    break
                remaining = deadline - time.monotonic()
                if stopping:
                    remaining = 0
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
            self._flush(records, ops)
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
        try:
            self._store(records)
            STATS["stored"] += len(records)
        except Exception as exc:
            STATS["failed"] += len(records)
            STATS["failed_batches"] += 1
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
