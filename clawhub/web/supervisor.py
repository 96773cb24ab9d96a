"""A few child processes run as one: start them all, wait until one of them exits or a stop is asked for, stop
them all. ``manage.py serve`` runs the embedded stack (web, worker, beat, vLLM) with it.

Each child gets its own session, so its process group holds everything it spawns (vLLM's engine processes, a
worker's pool) and stopping the group stops all of that; it also keeps a Ctrl-C in the terminal from reaching
the children directly, so the supervisor alone decides the order of shutdown.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("clawhub.supervisor")


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    log_path: Path | None = None  # None: the child writes to the supervisor's own stdout and stderr
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None


def start_all(children: list[Child]) -> None:
    for child in children:
        _start(child)


def _start(child: Child) -> None:
    log = None
    if child.log_path is not None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(child.log_path, "ab")  # appended: the log of an earlier run stays readable
    try:
        child.proc = subprocess.Popen(
            child.argv, env=child.env, cwd=child.cwd, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT if log is not None else None, start_new_session=True,
        )
    finally:
        if log is not None:
            log.close()  # the child holds its own copy of the descriptor
    logger.info("started %s (pid %s)", child.name, child.pid)


def wait_any(children: list[Child], *, stop: threading.Event, timeout: float | None = None,
             poll_seconds: float = 0.2) -> Child | None:
    """The first child found to have exited; None once ``stop`` is set or ``timeout`` seconds have passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for child in children:
            if child.returncode is not None:
                return child
        if stop.wait(poll_seconds):
            return None
        if deadline is not None and time.monotonic() >= deadline:
            return None


def stop_all(children: list[Child], *, grace_seconds: float = 20.0) -> None:
    """SIGTERM to every child's process group, then SIGKILL to whatever is left after ``grace_seconds``.

    A group can outlive its leader (a child that exited but left its own children behind), so the groups are
    signalled whether or not the leader still runs.
    """
    started = [child for child in children if child.proc is not None]
    for child in started:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(_group_alive(child) for child in started):
        time.sleep(0.2)
    for child in started:
        if _group_alive(child):
            logger.warning("%s did not stop within %.0f s: killing it", child.name, grace_seconds)
            _signal_group(child, signal.SIGKILL)
    for child in started:
        try:
            child.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.error("%s (pid %s) is still running after SIGKILL", child.name, child.pid)


def _signal_group(child: Child, sig: signal.Signals) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass  # the whole group is gone already


def _group_alive(child: Child) -> bool:
    child.proc.poll()  # reap the leader, or its zombie would keep the group "alive"
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return False
    return True
