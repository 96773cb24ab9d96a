"""The local spool of the capture hand-off (``capture.handoff`` says when it is used and why it is built so):
append-only segment files, one writer process per file, frames of ``length, crc32, time, payload``; the
in-flight journal of each gateway process; and, without Redis, the dead letters and the consumer's counters.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from clawhub.conversations.capture.records import TurnRecord, decode, encode, without_content

logger = logging.getLogger("clawhub.gateway.handoff")

FRAME = struct.Struct("<IId")  # payload length, crc32 of the payload, unix time of the append
SEGMENT_BYTES = 64 * 1024 * 1024
SYNC_INTERVAL = 0.1
JOURNAL_COMPACT_BYTES = 4 * 1024 * 1024
_SEGMENT = re.compile(r"^(?P<instance>[0-9a-zA-Z_-]+)\.(?P<seq>\d{8})\.seg$")


# --- the spool ----------------------------------------------------------------------------------------------


@dataclass
class SpoolFrame:
    end: int  # offset just past this frame: what to acknowledge
    appended_at: float
    payload: bytes | None  # None: the checksum failed (a damaged frame; goes to dead letters as raw bytes)
    raw: bytes = b""


@dataclass
class SpoolInstance:
    name: str
    segments: list[Path]
    alive: bool


class Spool:
    """A folder of append-only segment files: one writer per file, any number of readers one after another.

    Writer side (a gateway process): ``open_writer``, ``append``, ``begin``/``end`` (the in-flight journal),
    ``sync``, ``close_writer``. Reader side (the consumer, or a gateway forwarding to Redis): ``instances``,
    ``read``, ``ack``, ``acked``, ``retire``, ``finish_instance``. Acknowledged offsets live next to each
    segment (``<segment>.ack``); they are written without fsync, because a lost acknowledgement only replays
    records the consumer stores idempotently.
    """

    def __init__(self, folder: Path, *, max_bytes: int, segment_bytes: int = SEGMENT_BYTES):
        self.folder, self.max_bytes, self.segment_bytes = Path(folder), max_bytes, segment_bytes
        self.instance: str | None = None
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._seq = 0
        self._segment_size = 0
        self._dirty = False
        self._journal_fd: int | None = None
        self._journal_size = 0
        self._in_flight: set[str] = set()
        self._used = 0  # bytes of every segment in the folder, as of the last scan plus own appends since
        self.alarmed = False

    # writer ---------------------------------------------------------------------------------------------
    def open_writer(self, instance: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.instance = instance
        self._lock_fd = os.open(self.folder / f"{instance}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._journal_fd = os.open(self._journal_path(instance), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                   0o644)
        self.rescan()

    def rescan(self) -> int:
        self._used = sum(p.stat().st_size for p in self.folder.glob("*.seg") if p.exists())
        return self._used

    @property
    def used_bytes(self) -> int:
        return self._used

    def append(self, payload: bytes) -> bool:
        """Appends one record; False (nothing written) when the folder is at its byte bound."""
        size = FRAME.size + len(payload)
        if self._used + size > self.max_bytes:
            return False
        if self._fd is None:
            path = self.folder / f"{self.instance}.{self._seq:08d}.seg"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._segment_size = os.fstat(self._fd).st_size
        os.write(self._fd, FRAME.pack(len(payload), zlib.crc32(payload), time.time()) + payload)
        self._segment_size += size
        self._used += size
        self._dirty = True
        if self._used > self.max_bytes * 0.8 and not self.alarmed:
            self.alarmed = True
            logger.warning("capture spool %s holds %d bytes, over 80%% of its %d-byte bound", self.folder,
                           self._used, self.max_bytes)
        if self._segment_size >= self.segment_bytes:
            self.seal()
        return True

    def seal(self) -> None:
        """Closes the current segment (the next append starts another), so a reader may finish it."""
        if self._fd is not None:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd, self._dirty = None, False
            self._seq += 1

    def has_open_segment(self) -> bool:
        return self._fd is not None

    def sync(self) -> None:
        fd = self._fd
        if fd is not None and self._dirty:
            self._dirty = False
            try:
                os.fdatasync(fd)
            except OSError:  # closed by seal() meanwhile: seal synced it
                pass

    def begin(self, request_id: str) -> None:
        self._in_flight.add(request_id)
        self._journal_write(f"+{request_id}\n")

    def end(self, request_id: str) -> None:
        if request_id in self._in_flight:
            self._in_flight.discard(request_id)
            self._journal_write(f"-{request_id}\n")

    def _journal_write(self, line: str) -> None:
        if self._journal_fd is None:
            return
        data = line.encode()
        os.write(self._journal_fd, data)
        self._journal_size += len(data)
        if self._journal_size > JOURNAL_COMPACT_BYTES:
            # Rewritten with only what is still open, then swapped in: the journal stays small.
            path = self._journal_path(self.instance)
            tmp = path.with_suffix(".tmp")
            text = "".join(f"+{rid}\n" for rid in self._in_flight).encode()
            tmp.write_bytes(text)
            os.replace(tmp, path)
            os.close(self._journal_fd)
            self._journal_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            self._journal_size = len(text)

    def in_flight(self) -> int:
        return len(self._in_flight)

    def close_writer(self) -> None:
        """A clean stop: seals the segment, drops an empty journal, releases the lock."""
        self.seal()
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
            if not self._in_flight:
                self._journal_path(self.instance).unlink(missing_ok=True)
        if self._lock_fd is not None:
            # Unlinked while still locked: a reader never mistakes a live writer for a dead one.
            (self.folder / f"{self.instance}.lock").unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _journal_path(self, instance: str | None) -> Path:
        return self.folder / f"{instance}.inflight"

    # reader ---------------------------------------------------------------------------------------------
    def instances(self) -> list[SpoolInstance]:
        """Writers with something in the folder, oldest first. ``alive``: a process holds the lock."""
        if not self.folder.is_dir():
            return []
        found: dict[str, list[tuple[int, Path]]] = {}
        for path in self.folder.iterdir():
            match = _SEGMENT.match(path.name)
            if match:
                found.setdefault(match["instance"], []).append((int(match["seq"]), path))
        for path in self.folder.glob("*.inflight"):
            found.setdefault(path.stem, [])
        for path in self.folder.glob("*.lock"):
            found.setdefault(path.stem, [])
        result = []
        for name, segments in sorted(found.items(), key=lambda kv: min((p.stat().st_mtime for _, p in kv[1]
                                                                         if p.exists()), default=0)):
            result.append(SpoolInstance(name, [p for _, p in sorted(segments)], self._alive(name)))
        return result

    def _alive(self, name: str) -> bool:
        if name == self.instance and self._lock_fd is not None:
            return True
        path = self.folder / f"{name}.lock"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def is_sealed(self, instance: SpoolInstance, segment: Path) -> bool:
        """No writer will append to it again: a later segment exists, or its writer is gone."""
        if not instance.alive:
            return True
        if instance.name == self.instance and self._fd is None:
            return True  # our own, sealed (this process is the forwarder)
        return segment != instance.segments[-1]

    def acked(self, segment: Path) -> int:
        try:
            return int(Path(f"{segment}.ack").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def ack(self, segment: Path, offset: int) -> None:
        tmp = Path(f"{segment}.ack.tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, f"{segment}.ack")

    def read(self, segment: Path, offset: int, *, max_records: int, max_bytes: int) -> list[SpoolFrame]:
        """Whole frames from ``offset`` on; a torn frame at the end (a write in progress, or cut by a crash)
        is left for later. At least one frame is returned when one is complete, however large."""
        frames: list[SpoolFrame] = []
        taken = 0
        try:
            with open(segment, "rb") as f:
                f.seek(offset)
                while len(frames) < max_records and (not frames or taken < max_bytes):
                    header = f.read(FRAME.size)
                    if len(header) < FRAME.size:
                        break
                    length, crc, appended_at = FRAME.unpack(header)
                    payload = f.read(length)
                    if len(payload) < length:
                        break
                    offset += FRAME.size + length
                    taken += length
                    ok = zlib.crc32(payload) == crc
                    frames.append(SpoolFrame(offset, appended_at, payload if ok else None,
                                             b"" if ok else payload))
        except FileNotFoundError:
            pass
        return frames

    def size(self, segment: Path) -> int:
        try:
            return segment.stat().st_size
        except FileNotFoundError:
            return 0

    def retire(self, segment: Path) -> None:
        segment.unlink(missing_ok=True)
        Path(f"{segment}.ack").unlink(missing_ok=True)

    def finish_instance(self, instance: SpoolInstance) -> list[str]:
        """For a dead writer whose segments are all consumed: the request ids its journal left open (in flight
        at the crash). Removes the journal and the lock file; returns those ids."""
        path = self._journal_path(instance.name)
        open_ids: dict[str, None] = {}
        try:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("+"):
                    open_ids[line[1:]] = None
                elif line.startswith("-"):
                    open_ids.pop(line[1:], None)
        except FileNotFoundError:
            pass
        path.unlink(missing_ok=True)
        (self.folder / f"{instance.name}.lock").unlink(missing_ok=True)
        return list(open_ids)

    def scrub_acknowledged(self, segment: Path, drop: Callable[[TurnRecord], bool]) -> int:
        """Rewrites in place each acknowledged record of ``segment`` that ``drop`` picks, as the same record
        without its content (``without_content``), padded to the frame's length with JSON whitespace under
        a fresh checksum: offsets and acknowledgements stay as they are, and a replay (an acknowledgement
        lost in a crash) reads a valid record with nothing in it. Only acknowledged frames: no reader reads
        them again, and the writer only appends past them. Returns how many were rewritten."""
        acked, offset, count = self.acked(segment), 0, 0
        try:
            fd = os.open(segment, os.O_RDWR)
        except FileNotFoundError:
            return 0
        try:
            while offset + FRAME.size <= acked:
                length, crc, appended_at = FRAME.unpack(os.pread(fd, FRAME.size, offset))
                start, end = offset + FRAME.size, offset + FRAME.size + length
                if end > acked:
                    break
                offset = end
                payload = os.pread(fd, length, start)
                if len(payload) < length or zlib.crc32(payload) != crc:
                    continue  # damaged: already dead-lettered as raw bytes, nothing to read a user from
                try:
                    record = decode(payload)
                except (orjson.JSONDecodeError, TypeError):
                    continue
                emptied = without_content(record)
                if emptied == record or not drop(record):
                    continue  # already empty, or not picked
                blank = encode(emptied)
                if len(blank) > length:  # never: every field is as short as or shorter than it was
                    continue
                blank = blank.ljust(length)
                os.pwrite(fd, FRAME.pack(length, zlib.crc32(blank), appended_at) + blank, start - FRAME.size)
                count += 1
        finally:
            os.close(fd)
        return count

    def oldest_unacked(self) -> float | None:
        """Append time of the oldest record not yet acknowledged, across every writer (for the lag)."""
        oldest = None
        for instance in self.instances():
            for segment in instance.segments:
                frames = self.read(segment, self.acked(segment), max_records=1, max_bytes=1)
                if frames:
                    t = frames[0].appended_at
                    oldest = t if oldest is None else min(oldest, t)
                    break
        return oldest


def spool_scrub(folder: Path, drop: Callable[[TurnRecord], bool]) -> int:
    """Empties every acknowledged record ``drop`` picks in the spool folder (a segment is retired only once it
    is full, 64 MB, and read to its end). Returns how many records were emptied."""
    spool = Spool(folder, max_bytes=0)
    return sum(spool.scrub_acknowledged(segment, drop)
               for instance in spool.instances() for segment in instance.segments)


def spool_scrub_user(folder: Path, user_id: int) -> int:
    """``spool_scrub`` of one user's records (an account deletion). Records not yet acknowledged are left to
    the consumer, which stores nothing of a user who is gone; the daily sweep empties them once acknowledged
    (clawhub.privacy.services.capture_spool_scrub_deleted)."""
    return spool_scrub(folder, lambda r: r.user_id == user_id)


# --- dead letters and stats without Redis -------------------------------------------------------------------


def spool_dead_letter(folder: Path, payload: bytes, reason: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    entry = orjson.dumps({"at": time.time(), "reason": reason, "payload": payload.decode("utf-8", "replace")})
    with open(folder / "dead-letters.jsonl", "ab") as f:
        f.write(entry + b"\n")
        f.flush()
        os.fsync(f.fileno())


def spool_stats_add(folder: Path, **counts: int) -> None:
    """Adds to the counters kept in ``stats.json`` (only the one spool consumer writes them)."""
    stats = spool_stats(folder)
    for name, n in counts.items():
        stats[name] = stats.get(name, 0) + n
    stats["heartbeat"] = time.time()
    tmp = folder / "stats.json.tmp"
    tmp.write_bytes(orjson.dumps(stats))
    os.replace(tmp, folder / "stats.json")


def spool_stats(folder: Path) -> dict[str, float]:
    try:
        return orjson.loads((folder / "stats.json").read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}


