"""The capture consumer: takes finished TurnRecords off the durable hand-off (``capture.handoff``) and stores
them with ``capture.store.capture_store``, which is idempotent by request id.

A record is acknowledged only after the transaction that stored it committed, so a consumer killed at any
point leaves its records to be delivered again (and skipped as known). Through a database outage it retries
the same batch with backoff (0.2 s doubling to 5 s) and counts each retry; outage retries never count against
a record. When the database answers but records fail (``capture_store`` commits the rest and raises
``CaptureFailed`` naming them; any other error fails the whole batch), the stored ones are acknowledged and
each failing record is retried alone with the same backoff; after CAPTURE_MAX_ATTEMPTS tries it goes to the
dead letters (``<stream>:dead``, or ``dead-letters.jsonl`` in the spool folder) with the reason, counted in
``clawhub_capture_failures_total{reason="dead_letter"}``, and its usage is still metered. A record that cannot
be decoded goes there at once. Nothing is acknowledged that was neither stored nor dead-lettered. Batches are
bounded by count and by bytes.

Run it as ``python manage.py capture_consumer`` (its own process in production, a child of ``./dev run``).
With Redis it reads the stream in the consumer group ``capture`` (claiming what a dead consumer had read after
CAPTURE_CLAIM_IDLE_SECONDS); without Redis it reads the spool folder, one consumer per folder (a lock), and
also finishes the spools of gateway processes that died, counting the requests they had in flight.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawhub.conversations.capture.handoff import HandoffSettings
from clawhub.conversations.capture.records import TurnRecord, decode
from clawhub.conversations.capture.spool import Spool, spool_dead_letter, spool_stats_add
from clawhub.core.db import keep_usable_connection

logger = logging.getLogger("clawhub.gateway.consumer")

BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0
HEARTBEAT_EVERY = 2.0
BLOCK_MS = 500
CALL_TIMEOUT = 5.0


@dataclass
class Entry:
    ref: Any  # the log's id for it: a stream id, or (segment, end offset)
    payload: bytes | None
    size: int
    record: TurnRecord | None = None
    raw: bytes = b""  # a damaged frame's bytes, kept for the dead letters


@contextlib.contextmanager
def folder_lock(folder: Path, name: str) -> Iterator[bool]:
    """A non-blocking flock on ``<folder>/<name>.folderlock``: yields whether this process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{name}.folderlock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def default_store(batch: list[TurnRecord]) -> None:
    from clawhub.conversations.capture.store import capture_store

    capture_store(batch)


def default_on_dead(record: TurnRecord) -> None:
    from clawhub.conversations.capture.store import capture_usage_only

    capture_usage_only(record=record)


def database_usable() -> bool:
    from django.db import connection

    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        connection.close()
        return False


# --- sources ------------------------------------------------------------------------------------------------


class RedisSource:
    def __init__(self, cfg: HandoffSettings, name: str):
        import redis

        self.cfg, self.name = cfg, name
        # Bounded, but not by the gateway's tight hot-path timeout: an acknowledgement that times out on a
        # busy host is delivered again (harmless, but wasted work). Reads block for BLOCK_MS on top.
        self.client = redis.Redis.from_url(cfg.redis_url, socket_timeout=CALL_TIMEOUT + BLOCK_MS / 1000,
                                           socket_connect_timeout=CALL_TIMEOUT)
        self._group_ready = False
        self._next_claim = 0.0

    def _ensure_group(self) -> None:
        import redis

        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.cfg.stream, self.cfg.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def fetch(self, count: int) -> list[Entry]:
        import redis

        try:
            return self._fetch(count)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "no longer exists" not in str(exc):
                raise
            # The stream was deleted under us (FLUSHDB, an operator): make the group again and go on.
            logger.warning("capture stream %s or its group vanished; creating them again", self.cfg.stream)
            self._group_ready = False
            return []

    def _fetch(self, count: int) -> list[Entry]:
        self._ensure_group()
        cfg = self.cfg
        entries: list[tuple[bytes, dict]] = []
        if time.monotonic() >= self._next_claim:
            # Records a consumer read and never acknowledged (it died): taken over once old enough.
            self._next_claim = time.monotonic() + max(0.5, cfg.claim_idle / 2)
            claimed = self.client.xautoclaim(cfg.stream, cfg.group, self.name, int(cfg.claim_idle * 1000),
                                             start_id="0-0", count=count)
            entries = [e for e in claimed[1] if e[1] is not None]
        if not entries:
            read = self.client.xreadgroup(cfg.group, self.name, {cfg.stream: ">"}, count=count,
                                          block=BLOCK_MS)
            entries = read[0][1] if read else []
            if entries and len(entries) < count and cfg.batch_linger > 0:
                # A few records: wait a moment for more, so that a batch's fixed cost is shared (they are
                # safe in the stream meanwhile; only their row appears later).
                time.sleep(cfg.batch_linger)
                more = self.client.xreadgroup(cfg.group, self.name, {cfg.stream: ">"},
                                              count=count - len(entries))
                entries += more[0][1] if more else []
        return [Entry(eid, fields.get(b"r"), len(fields.get(b"r") or b"")) for eid, fields in entries]

    def ack(self, entries: list[Entry], stored: int) -> None:
        cfg = self.cfg
        ids = [e.ref for e in entries]
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(cfg.stream, cfg.group, *ids)
        pipe.xdel(cfg.stream, *ids)
        pipe.decrby(cfg.bytes_key, sum(e.size for e in entries))
        pipe.hincrby(cfg.stats_key, "stored", stored)
        pipe.execute()

    def dead_letter(self, entry: Entry, reason: str) -> None:
        cfg = self.cfg
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(cfg.dead_stream, {"r": entry.payload or entry.raw, "reason": reason, "id": entry.ref})
        pipe.xack(cfg.stream, cfg.group, entry.ref)
        pipe.xdel(cfg.stream, entry.ref)
        pipe.decrby(cfg.bytes_key, entry.size)
        pipe.hincrby(cfg.stats_key, "dead_letters", 1)
        pipe.execute()

    def add_stats(self, **counts: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        for name, n in counts.items():
            pipe.hincrby(self.cfg.stats_key, name, int(n))
        pipe.hset(self.cfg.stats_key, "heartbeat", time.time())
        pipe.execute()

    def backlog(self) -> int:
        self._ensure_group()
        return int(self.client.xlen(self.cfg.stream))

    def close(self) -> None:
        self.client.close()


class SpoolSource:
    """The spool folder as a log: segments in order, per writer; one consumer per folder."""

    def __init__(self, cfg: HandoffSettings):
        self.cfg = cfg
        self.spool = Spool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes)
        cfg.spool_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(cfg.spool_dir / "consumer.folderlock", os.O_RDWR | os.O_CREAT, 0o644)
        self._locked = False

    def _lock(self) -> bool:
        if not self._locked:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._locked = True
            except BlockingIOError:
                return False
        return True

    def fetch(self, count: int) -> list[Entry]:
        if not self._lock():
            time.sleep(BLOCK_MS / 1000)  # another consumer has this folder
            return []
        spool = self.spool
        for instance in spool.instances():
            for segment in instance.segments:
                offset = spool.acked(segment)
                frames = spool.read(segment, offset, max_records=count, max_bytes=self.cfg.batch_bytes)
                if frames:
                    return [Entry((segment, f.end), f.payload, len(f.raw if f.payload is None else f.payload),
                                  raw=f.raw) for f in frames]
                if spool.is_sealed(instance, segment) and offset >= spool.size(segment):
                    spool.retire(segment)
                    continue
                break  # the writer is still appending to this one
            else:
                if not instance.alive:
                    lost = spool.finish_instance(instance)
                    if lost:
                        report_lost(instance.name, lost)
                        self.add_stats(lost_in_flight=len(lost))
        time.sleep(BLOCK_MS / 1000 / 5)
        return []

    def ack(self, entries: list[Entry], stored: int) -> None:
        last: dict[Path, int] = {}
        for entry in entries:
            segment, end = entry.ref
            last[segment] = max(end, last.get(segment, 0))
        for segment, end in last.items():
            self.spool.ack(segment, end)
        self.add_stats(stored=stored)

    def dead_letter(self, entry: Entry, reason: str) -> None:
        spool_dead_letter(self.cfg.spool_dir, entry.payload or entry.raw, reason)
        segment, end = entry.ref
        self.spool.ack(segment, end)
        self.add_stats(dead_letters=1)

    def add_stats(self, **counts: float) -> None:
        spool_stats_add(self.cfg.spool_dir, **{k: int(v) for k, v in counts.items()})

    def backlog(self) -> int:
        total = 0
        for instance in self.spool.instances():
            for segment in instance.segments:
                total += max(0, self.spool.size(segment) - self.spool.acked(segment))
        return total

    def close(self) -> None:
        os.close(self._lock_fd)


def report_lost(instance: str, lost: list[str]) -> None:
    logger.warning("gateway process %s stopped with %d requests in flight; their turns were never finished: "
                   "%s", instance, len(lost), " ".join(lost[:50]))


def requeue_undecodable(cfg: HandoffSettings) -> tuple[int, int]:
    """Puts dead letters that were dead-lettered as undecodable, and that this consumer decodes, back on the
    stream; returns (requeued, left undecodable). For an upgrade that changed the record format: a consumer
    older than the gateway that wrote a record dead-letters it (``records``: prompt ids after the object).
    Storing is idempotent by request id, and undecodable records were never metered, so nothing counts twice.
    Letters of records that failed to store are left alone (their usage was metered when they went there)."""
    import redis

    client = redis.Redis.from_url(cfg.redis_url, socket_timeout=CALL_TIMEOUT,
                                  socket_connect_timeout=CALL_TIMEOUT)
    requeued = left = 0
    start = "-"
    try:
        while True:
            page = client.xrange(cfg.dead_stream, min=start, count=500)
            for eid, fields in page:
                if not fields.get(b"reason", b"").startswith(b"undecodable"):
                    continue
                payload = fields.get(b"r") or b""
                try:
                    decode(payload)
                except Exception:
                    left += 1
                    continue
                pipe = client.pipeline(transaction=True)
                pipe.xadd(cfg.stream, {"r": payload})
                pipe.incrby(cfg.bytes_key, len(payload))
                pipe.xdel(cfg.dead_stream, eid)
                pipe.execute()
                requeued += 1
            if len(page) < 500:
                return requeued, left
            start = "(" + page[-1][0].decode()
    finally:
        client.close()


# --- the consumer -------------------------------------------------------------------------------------------


class CaptureConsumer:
    def __init__(self, cfg: HandoffSettings | None = None, *,
                 store: Callable[[list[TurnRecord]], None] | None = None, name: str | None = None,
                 on_dead: Callable[[TurnRecord], None] | None = None):
        self.cfg = cfg or HandoffSettings.from_settings()
        self._store = store or default_store
        # What a dead-lettered record still needs (its usage); a test's own store has nothing to meter.
        self._on_dead = on_dead or (default_on_dead if store is None else None)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{threading.get_ident() % 10000}"
        self.source = RedisSource(self.cfg, self.name) if self.cfg.redis_url else SpoolSource(self.cfg)
        self._attempts: dict[Any, int] = {}
        self._idle = threading.Event()  # set while the log has nothing for us
        self._last_beat = 0.0
        self.stats = {"stored": 0, "retries": 0, "dead_letters": 0, "batches": 0}

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set: fetch, store, acknowledge; through outages of the database or the log."""
        backoff = BACKOFF_FIRST
        while not stop.is_set():
            try:
                handled = self.run_once(stop)
                backoff = BACKOFF_FIRST
                if not handled:
                    self._idle.set()
            except _Outage:
                stop.wait(backoff)
                backoff = min(BACKOFF_MAX, backoff * 2)
            except Exception as exc:
                # The log itself is unreachable (Redis restarting): wait and try again.
                logger.warning("capture consumer: the log is unreachable (%s: %s); retrying in %.1f s",
                               type(exc).__name__, exc, backoff)
                self._idle.clear()
                stop.wait(backoff)
                backoff = min(BACKOFF_MAX, backoff * 2)
            self._heartbeat()
        self._close_db()

    def run_once(self, stop: threading.Event | None = None) -> int:
        entries = self.source.fetch(self.cfg.batch_records)
        if not entries:
            return 0
        self._idle.clear()
        good: list[Entry] = []
        for entry in entries:
            if entry.payload is None:
                self._dead(entry, "damaged frame")
                continue
            try:
                entry.record = decode(entry.payload)
            except Exception as exc:
                self._dead(entry, f"undecodable: {type(exc).__name__}: {exc}")
                continue
            good.append(entry)
        for chunk in _by_bytes(good, self.cfg.batch_bytes):
            self._store_chunk(chunk, stop)
        return len(entries)

    def _store_chunk(self, chunk: list[Entry], stop: threading.Event | None) -> None:
        from clawhub.conversations.capture.store import CaptureFailed

        backoff = BACKOFF_FIRST
        while True:
            try:
                self._store_and_ack(chunk)
                return
            except CaptureFailed as exc:
                chunk = self._ack_stored(chunk, exc)  # the database answers; these records did not store
                break
            except Exception as exc:
                if database_usable():
                    break  # the database answers: something in the batch is the problem
                self.stats["retries"] += 1
                self._add_stats(retries=1)
                logger.warning("capture consumer: database unreachable (%s); %d records wait, retrying in "
                               "%.1f s", type(exc).__name__, len(chunk), backoff)
                self._wait(backoff, stop)
                backoff = min(BACKOFF_MAX, backoff * 2)
        # One by one, so a poison record costs only itself.
        for entry in chunk:
            self._store_alone(entry, stop)

    def _ack_stored(self, chunk: list[Entry], failed: Exception) -> list[Entry]:
        """Acknowledges the entries ``capture_store`` committed; returns those it named as failing."""
        failing = {record.request_id for record, _ in failed.failures}
        stored = [e for e in chunk if e.record.request_id not in failing]
        if stored:
            self.source.ack(stored, stored=len(stored))
            self.stats["stored"] += len(stored)
            self.stats["batches"] += 1
        return [e for e in chunk if e.record.request_id in failing]

    def _store_alone(self, entry: Entry, stop: threading.Event | None) -> None:
        """Stores one record, retried with backoff while the database answers, then dead-lettered."""
        while True:
            try:
                self._store_and_ack([entry])
                self._attempts.pop(entry.ref, None)
                return
            except Exception as exc:
                if not database_usable():
                    self._add_stats(retries=1)
                    raise _Outage from None
                attempts = self._attempts[entry.ref] = self._attempts.get(entry.ref, 0) + 1
                self.stats["retries"] += 1
                self._add_stats(retries=1)
                if attempts >= self.cfg.max_attempts:
                    self._attempts.pop(entry.ref, None)
                    cause = _cause(exc)
                    self._dead(entry, f"failed {attempts} times: {type(cause).__name__}: {cause}")
                    return
                # A deadlock or a statement timeout may pass; a bug will not, and costs only its attempts.
                self._wait(min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (attempts - 1)), stop)

    @staticmethod
    def _wait(seconds: float, stop: threading.Event | None) -> None:
        if stop is None:
            time.sleep(seconds)
        elif stop.wait(seconds):
            raise _Outage from None  # stopping: nothing more acknowledged, delivered again later

    def _store_and_ack(self, entries: list[Entry]) -> None:
        keep_usable_connection()
        self._store([e.record for e in entries])
        self.source.ack(entries, stored=len(entries))
        self.stats["stored"] += len(entries)
        self.stats["batches"] += 1

    def _dead(self, entry: Entry, reason: str) -> None:
        from clawhub.core import metrics

        logger.error("capture consumer: record %s goes to the dead letters: %s", entry.ref, reason)
        self.source.dead_letter(entry, reason[:500])
        self.stats["dead_letters"] += 1
        metrics.CAPTURE_FAILURES.labels(reason="dead_letter").inc()
        if entry.record is not None and self._on_dead is not None:
            self._on_dead(entry.record)

    def _add_stats(self, **counts: int) -> None:
        try:
            self.source.add_stats(**counts)
        except Exception:
            pass  # the log is down too: the counter is lost, the records are not

    def _heartbeat(self) -> None:
        if time.monotonic() - self._last_beat >= HEARTBEAT_EVERY:
            self._last_beat = time.monotonic()
            self._add_stats()

    def drain(self, timeout: float) -> bool:
        """Waits until the log has nothing left for this consumer (tests, in-process shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._idle.clear()
            if self._idle.wait(min(1.0, max(0.01, deadline - time.monotonic()))):
                try:
                    if self.source.backlog() == 0:
                        return True
                except Exception:
                    return False
        return False

    def close(self) -> None:
        try:
            self.source.close()
        except Exception:
            pass

    def _close_db(self) -> None:
        from django.db import connections

        connections.close_all()


def _cause(exc: Exception) -> Exception:
    """The one record's own error inside a CaptureFailed, else the error itself."""
    failures = getattr(exc, "failures", None)
    return failures[0][1] if failures and len(failures) == 1 else exc


class _Outage(Exception):
    """The database is unreachable: the batch waits, nothing is acknowledged."""


def _by_bytes(entries: list[Entry], limit: int) -> Iterator[list[Entry]]:
    chunk: list[Entry] = []
    size = 0
    for entry in entries:
        if chunk and size + entry.size > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += entry.size
    if chunk:
        yield chunk
