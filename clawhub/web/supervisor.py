"""A few child processes run as one: start them all, keep them running, stop them all. ``manage.py serve``
runs the embedded stack (web, worker, beat, capture, vLLM) with it.

``Supervisor.run`` restarts a child that exits on its own, after a back-off that doubles from 1 s up to 30 s
(reset once the child has stayed up for a minute), and says so. A child that fails 5 times within 5 minutes
is given up on: ``run`` returns it and the caller stops everything, since a stack with a part that cannot
stay up is better stopped loudly than left half alive. A child with a ``health_url`` (vLLM) is also
reported when it answers again after a restart.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

logger = logging.getLogger("clawhub.supervisor")


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    log_path: Path | None = None  # None: the child writes to the supervisor's own stdout and stderr
    health_url: str | None = None  # answers 200 once the child serves (checked after a restart)
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


@dataclass(frozen=True)
class RestartPolicy:
    backoff_seconds: float = 1.0  # before the first restart; doubled for each failure in a row
    backoff_max_seconds: float = 30.0
    stable_seconds: float = 60.0  # up this long after a restart: the next failure starts the back-off again
    max_failures: int = 5  # this many exits within window_seconds: give up
    window_seconds: float = 300.0
    poll_seconds: float = 0.2
    health_every_seconds: float = 1.0


@dataclass
class _Track:
    failures: list[float] = field(default_factory=list)  # monotonic times of unexpected exits
    in_a_row: int = 0
    started: float = 0.0
    restart_at: float | None = None  # a restart is due then
    awaiting_health: float | None = None  # restarted at; reported once its health_url answers
    next_probe: float = 0.0


class Supervisor:
    """Keeps started children running (see the module docstring for the policy)."""

    def __init__(self, children: list[Child], *, policy: RestartPolicy | None = None,
                 say: Callable[[str], None] = print):
        self.children, self.policy, self.say = children, policy or RestartPolicy(), say
        now = time.monotonic()
        self._tracks = {id(child): _Track(started=now) for child in children}

    def run(self, stop: threading.Event) -> Child | None:
        """Until ``stop`` is set (returns None) or a child failed too often (returns it)."""
        policy = self.policy
        while not stop.wait(policy.poll_seconds):
            now = time.monotonic()
            for child in self.children:
                track = self._tracks[id(child)]
                if track.restart_at is not None:
                    if now >= track.restart_at:
                        self._restart(child, track, now)
                    continue
                code = child.returncode
                if code is None:
                    if track.awaiting_health is not None and now >= track.next_probe:
                        self._probe(child, track, now)
                    continue
                if self._failed(child, track, code, now):
                    return child
        return None

    def _failed(self, child: Child, track: _Track, code: int, now: float) -> bool:
        policy = self.policy
        track.failures = [t for t in track.failures if now - t < policy.window_seconds] + [now]
        if len(track.failures) >= policy.max_failures:
            self.say(f"{child.name} exited with code {code}: {len(track.failures)} failures within "
                     f"{policy.window_seconds:.0f} s; giving up.")
            return True
        track.in_a_row = 1 if now - track.started >= policy.stable_seconds else track.in_a_row + 1
        delay = min(policy.backoff_max_seconds, policy.backoff_seconds * 2 ** (track.in_a_row - 1))
        self.say(f"{child.name} exited with code {code}; restarting it in {delay:.0f} s "
                 f"(failure {len(track.failures)} of {policy.max_failures} allowed within "
                 f"{policy.window_seconds:.0f} s).")
        # Whatever it spawned (vLLM's engine, a worker's pool) goes with it, or it would hold the port or
        # the queue the new one needs.
        _signal_group(child, signal.SIGKILL)
        child.proc.wait()
        track.restart_at = now + delay
        return False

    def _restart(self, child: Child, track: _Track, now: float) -> None:
        track.restart_at = None
        track.started = now
        _start(child)
        self.say(f"{child.name} restarted (pid {child.pid}).")
        if child.health_url is not None:
            track.awaiting_health, track.next_probe = now, now

    def _probe(self, child: Child, track: _Track, now: float) -> None:
        track.next_probe = now + self.policy.health_every_seconds
        try:
            healthy = httpx.get(child.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if healthy:
            waited = now - track.awaiting_health
            self.say(f"{child.name} is serving again ({waited:.0f} s after the restart).")
            track.awaiting_health = None
