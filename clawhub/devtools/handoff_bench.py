"""``manage.py bench_handoff``: what the capture hand-off's durability costs, and what a Redis crash loses.

A benchmark, not a test. For each AOF fsync policy (``everysec``, Redis' default and what deploy/ runs, and
``always``), a redis-server of the bench's own (its own port and folder, on the disk the temporary folder is
on) takes the gateway's hand-off: one pipeline per record, ``XADD`` of the record, ``INCRBY`` of the byte
counter and ``XLEN``, as the writer's sender sends it at steady load. The bench prints:

- the pipeline's latency at a paced rate (p50, p99, max), and redis-server's CPU per record;
- the records per second it takes from several concurrent senders (as several gateway workers send);
- a crash: redis-server killed with SIGKILL under the paced load, started again on its AOF, and the records
  Redis had acknowledged that are missing afterwards. A process crash leaves what Redis wrote in the kernel,
  so this is the loss on a Redis crash; a machine crash or power loss can lose what was not yet fsynced, which
  is bounded by the policy (``everysec``: about the last second of records; ``always``: none) and cannot be
  produced here.

It also times the alternative the gateway could fsync itself: one ``write`` and ``fdatasync`` of a record to
a file on the same disk (a local journal).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

MODES = ("everysec", "always")
STREAM = "bench:capture"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BenchRedis:
    """redis-server with AOF on, in a folder and on a port of the bench's own."""

    def __init__(self, folder: Path, fsync: str):
        self.folder, self.fsync, self.port = folder, fsync, _free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if not exe:
            raise RuntimeError("redis-server is not installed")
        self.process = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.folder),
             "--appendonly", "yes", "--appendfsync", self.fsync],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + 30
        while True:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.2).ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@dataclass
class Sent:
    latencies: list[float]
    acked: list[int]  # the records Redis answered for


async def _send(port: int, *, senders: int, seconds: float, payload: bytes, rate: float | None = None,
                ) -> Sent:
    """``senders`` concurrent connections, each sending one record per pipeline, at ``rate`` records per
    second in all (None: as fast as Redis answers), for ``seconds`` or until a call fails."""
    import redis.asyncio as aioredis

    sent = Sent([], [])
    numbers = iter(range(1, 10**9))
    start = time.monotonic()

    async def sender(k: int) -> None:
        client = aioredis.Redis(port=port, socket_timeout=5, socket_connect_timeout=2)
        j = 0
        try:
            while time.monotonic() - start < seconds:
                i = next(numbers)
                pipe = client.pipeline(transaction=False)
                pipe.xadd(STREAM, {"r": payload, "i": i})
                pipe.incrby(f"{STREAM}:bytes", len(payload))
                pipe.xlen(STREAM)
                t0 = time.perf_counter()
                try:
                    await pipe.execute()
                except Exception:
                    return  # Redis is gone (the crash)
                sent.latencies.append(time.perf_counter() - t0)
                sent.acked.append(i)
                if rate:
                    j += 1
                    await asyncio.sleep(max(0.0, start + (j * senders + k) / rate - time.monotonic()))
        finally:
            try:
                await client.aclose()
            except Exception:
                pass

    await asyncio.gather(*(sender(k) for k in range(senders)))
    return sent


def _stored_ids(port: int) -> set[int]:
    import redis

    client = redis.Redis(port=port, socket_timeout=30)
    ids, last = set(), "-"
    while True:
        batch = client.xrange(STREAM, min=last, count=5000)
        if last != "-":
            batch = batch[1:]
        if not batch:
            break
        ids.update(int(fields[b"i"]) for _, fields in batch if b"i" in fields)
        last = batch[-1][0].decode()
    client.close()
    return ids


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def _journal(folder: Path, *, count: int, payload: bytes) -> list[float]:
    fd = os.open(folder / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    latencies = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, payload)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return latencies


def run(*, rate: float, seconds: float, payload_bytes: int, senders: int, out: TextIO) -> dict[str, dict]:
    import redis

    payload = b"x" * payload_bytes
    results: dict[str, dict] = {}
    out.write(f"capture hand-off on Redis AOF: {payload_bytes}-byte records, paced {rate:.0f}/s for "
              f"{seconds:.0f} s, {senders} concurrent senders; folder on {tempfile.gettempdir()}\n")
    for mode in MODES:
        folder = Path(tempfile.mkdtemp(prefix=f"clawhub-bench-aof-{mode}-"))
        server = BenchRedis(folder, mode)
        try:
            server.start()
            cpu0 = server.cpu_seconds()
            paced = asyncio.run(_send(server.port, senders=1, seconds=seconds, payload=payload, rate=rate))
            cpu = (server.cpu_seconds() - cpu0) / max(1, len(paced.acked)) * 1000
            cpu0 = server.cpu_seconds()
            full = asyncio.run(_send(server.port, senders=senders, seconds=seconds, payload=payload))
            full_cpu = (server.cpu_seconds() - cpu0) / max(1, len(full.acked)) * 1000
            # The crash: a fresh stream under the saturating load, SIGKILL 2 s in (records in flight on every
            # sender), then Redis again on the same folder.
            redis.Redis(port=server.port).delete(STREAM)
            timer = threading.Timer(2.0, server.kill)
            timer.start()
            crashed = asyncio.run(_send(server.port, senders=senders, seconds=seconds + 5, payload=payload))
            timer.join()
            server.start()
            present = _stored_ids(server.port)
            lost = [i for i in crashed.acked if i not in present]
            results[mode] = {
                "p50_ms": _pct(paced.latencies, 0.5), "p99_ms": _pct(paced.latencies, 0.99),
                "max_ms": max(paced.latencies) * 1000, "redis_cpu_ms": cpu,
                "saturated_per_s": len(full.acked) / seconds, "saturated_p50_ms": _pct(full.latencies, 0.5),
                "saturated_cpu_ms": full_cpu, "acked_before_kill": len(crashed.acked), "lost": len(lost),
            }
        finally:
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix="clawhub-bench-journal-"))
    try:
        journal = _journal(folder, count=int(rate * seconds / 4) or 1, payload=payload)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out.write("| appendfsync | paced p50 / p99 / max ms | Redis CPU ms per record (paced / saturated) | "
              "saturated: records/s, p50 ms | Redis SIGKILL: acked, lost |\n|---|---|---|---|---|\n")
    for mode in MODES:
        r = results[mode]
        out.write(f"| {mode} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} / {r['max_ms']:.1f} | "
                  f"{r['redis_cpu_ms']:.3f} / {r['saturated_cpu_ms']:.3f} | {r['saturated_per_s']:.0f}, "
                  f"{r['saturated_p50_ms']:.2f} | {r['acked_before_kill']}, {r['lost']} |\n")
    out.write(f"local journal (write + fdatasync of one record, {len(journal)} times): p50 "
              f"{_pct(journal, 0.5):.3f} ms, p99 {_pct(journal, 0.99):.3f} ms, "
              f"max {max(journal) * 1000:.1f} ms\n")
    results["journal"] = {"p50_ms": _pct(journal, 0.5), "p99_ms": _pct(journal, 0.99)}
    return results
