"""Processes a benchmark starts and measures: a free port, waiting for a server to answer, starting and
stopping a process group, and the CPU time of a process tree (from /proc)."""

import os
import signal
import socket
import subprocess
import time

import httpx

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def tree_cpu_seconds(root: int) -> float:
    """utime + stime of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except OSError:
                continue
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
        stack.extend(children.get(pid, []))
    return total


def spawn(args: list[str], env: dict | None = None, *, drop: tuple[str, ...] = ()) -> subprocess.Popen:
    environment = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.Popen(args, env={**environment, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        process.kill()
