"""Helpers for running README command 1 (`./dev run`) from a clean clone and talking to it over HTTP only.

The full stack takes minutes to start on two cores, so the tests that need one share a single `./dev run`
(the ``shared_stack`` session fixture): the real OpenClaw CLI tests, the vLLM restart test and the README
test, which is the one that stops it (Ctrl-C) and must therefore run last (it does: its file sorts after the
others). Each test signs up its own user, so their sessions, samples and adapters stay apart.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = "ClawHub is ready: "
START_TIMEOUT_S = 300  # vLLM loading the tiny model on two busy CPU cores
STOP_TIMEOUT_S = 60
# Settings of the test session (PostgreSQL, Redis, the test settings module) must not leak into the embedded
# run: it is the default a newcomer gets, with nothing configured.
STRIPPED_ENV_PREFIXES = ("DJANGO_", "DATABASE_", "REDIS_", "CELERY_", "CLAWHUB_", "GATEWAY_")
# The shared stack's settings: what the README test needs to see a whole training loop quickly.
TRAINING_BATCH_SIZE = 4
STACK_ENV = {
    # A small batch, and the periodic kick (celery beat) looking for a full one every 5 s instead of 30 s.
    "CLAWHUB_TRAINING_BATCH_SIZE": str(TRAINING_BATCH_SIZE),
    "CLAWHUB_TRAIN_KICK_SECONDS": "5",
    # The eval gate still runs for real (the candidate and the base model answer held-out prompts, scored by
    # the style reward), but it cannot reject: that reward is -1 or +1, so two means differ by at most 2, and
    # the margin is 2. What the tiny random model writes must not decide whether a test passes. Two
    # prompts of 16 tokens keep the gate quick on two CPU cores.
    "CLAWHUB_EVAL_MARGIN": "2.0",
    "CLAWHUB_EVAL_PROMPTS": "2",
    "CLAWHUB_EVAL_MAX_TOKENS": "16",
}
# For iterating only (never set in CI): a JSON object of extra settings for the shared stack, e.g. another
# CLAWHUB_BASE_MODEL. Read here, in the test process; the stack itself still gets a stripped environment.
EXTRA_STACK_ENV = json.loads(os.environ.get("CLAWHUB_TEST_STACK_ENV") or "{}")


def make_clone(dest: Path) -> Path:
    """A clean clone of this repository at ``dest``: ``git clone`` when the working tree is committed,
    otherwise a copy of the tracked and untracked files git does not ignore (what a commit of the tree would
    hold). The clone borrows this checkout's .venv and .venv-vllm through symlinks instead of installing 2 GB
    again."""
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.strip()
    if not dirty:
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True)
    else:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            source = ROOT / name
            if source.is_file():  # tracked files deleted in the working tree are skipped
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / name)
    for venv in (".venv", ".venv-vllm"):
        (dest / venv).symlink_to(ROOT / venv, target_is_directory=True)
    return dest


@dataclass
class Stack:
    """One `./dev run` of a clone: its process, output and addresses, and every process it started."""

    proc: subprocess.Popen
    output_path: Path
    url: str
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create_time, so a reused pid is not blamed
    left: list[str] = field(default_factory=list)  # what was still running once the command had exited

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def record_processes(self) -> list[psutil.Process]:
        """The command's whole process tree now, remembered for `left_running`."""
        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for process in tree:
            try:
                self.seen[process.pid] = process.create_time()
            except psutil.NoSuchProcess:
                pass
        return tree

    def left_running(self) -> list[str]:
        alive = []
        for pid, created in self.seen.items():
            try:
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(process.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return alive

    def kill_leftovers(self) -> None:
        for pid, created in self.seen.items():
            try:
                process = psutil.Process(pid)
                if process.create_time() == created:
                    process.kill()
            except psutil.NoSuchProcess:
                pass


@contextmanager
def running(argv: list[str], cwd: Path, data_dir: Path, log_dir: Path, *, stop_signal: int = signal.SIGINT,
            **extra_env: str) -> Iterator[Stack]:
    """Starts ``argv`` (`./dev run`, or `manage.py serve`) on the embedded default and yields once it printed
    that it is ready. On leaving, stops it the way Ctrl-C does (``stop_signal`` to its process group) and
    waits for it to exit. What it left running is listed in ``stack.left`` and then killed, so a failing test
    does not leave a vLLM behind on a shared machine."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED_ENV_PREFIXES)}
    env.update(CLAWHUB_DATA_DIR=str(data_dir), CLAWHUB_PORT=str(port), CLAWHUB_VLLM_PORT=str(free_port()),
               **extra_env)
    log_dir.mkdir(parents=True, exist_ok=True)
    output_path = log_dir / f"run-{len(list(log_dir.glob('run-*')))}.log"
    with open(output_path, "wb") as output:
        # Its own process group, like a command in a terminal: a Ctrl-C there reaches exactly this group.
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    stack = Stack(proc=proc, output_path=output_path, url=f"http://127.0.0.1:{port}")
    try:
        _wait_ready(stack)
        stack.record_processes()
        yield stack
    finally:
        stop(stack, stop_signal)


def stop(stack: Stack, stop_signal: int = signal.SIGINT) -> None:
    """Stops a running command as Ctrl-C does and waits for it; lists and kills what it left running. Once
    stopped, calling it again changes nothing."""
    proc = stack.proc
    stack.record_processes()
    if proc.poll() is None:
        os.killpg(proc.pid, stop_signal)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the returncode (-9) tells the test it did not stop
            proc.wait(timeout=10)
    stack.left = stack.left_running()
    stack.kill_leftovers()


@dataclass
class SharedStack:
    stack: Stack
    clone: Path
    data_dir: Path
    logs: Path


@pytest.fixture(scope="session")
def _shared_stack(tmp_path_factory) -> Iterator[SharedStack]:
    root = tmp_path_factory.mktemp("shared-stack")
    clone = make_clone(root / "clone")
    with dev_run(clone, root / "data", root / "logs", **{**STACK_ENV, **EXTRA_STACK_ENV}) as stack:
        yield SharedStack(stack, clone, root / "data", root / "logs")


@pytest.fixture
def shared_stack(_shared_stack) -> SharedStack:
    """The session's one `./dev run` (see the module docstring), still running."""
    if _shared_stack.stack.proc.poll() is not None:
        pytest.fail("the shared ./dev run was already stopped (by the README test, which must run last)")
    return _shared_stack


def dev_run(clone: Path, data_dir: Path, log_dir: Path, **kwargs):
    """README command 1 in a clone. The clone borrows this checkout's venvs, so it must not install into them
    (that would re-point their editable install at the clone). It serves the tiny model, not the default
    SmolLM2: on two cores the real model's first OpenClaw turn alone takes about a minute of prefill, and
    its training steps many times the tiny model's (tests/model/test_real_model.py serves and trains it)."""
    kwargs.setdefault("CLAWHUB_BASE_MODEL", str(clone / "models" / "tiny-qwen2"))
    return running(["./dev", "run"], clone, data_dir, log_dir, CLAWHUB_SKIP_INSTALL="1", **kwargs)


def _wait_ready(stack: Stack) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if stack.proc.poll() is not None:
            code = stack.proc.returncode
            pytest.fail(f"the command exited with {code} while starting:\n{_tail(stack.output())}")
        if READY_LINE in stack.output():
            return
        stack.record_processes()  # vLLM's helpers may come and go while it loads
        time.sleep(1)
    pytest.fail(f"the command did not say it was ready within {START_TIMEOUT_S} s:\n{_tail(stack.output())}")


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def signed_in_client(url: str, email: str, password: str, *, signup: bool) -> httpx.Client:
    """An HTTP client holding a session cookie, signed in through the REST API the way the web app does."""
    client = httpx.Client(base_url=url, timeout=30)
    client.get("/api/auth/csrf/").raise_for_status()
    if signup:  # sign-up signs nobody in (its answer must not tell who has an account): log in after it
        response = post(client, "/api/auth/signup/", {"email": email, "password": password})
        assert response.status_code == 201, response.text
    response = post(client, "/api/auth/login/", {"email": email, "password": password})
    assert response.status_code == 200, response.text
    return client


def post(client: httpx.Client, path: str, body: dict) -> httpx.Response:
    # Signing in rotates the CSRF token: always send the newest cookie's value.
    return client.post(path, json=body, headers={"X-CSRFToken": client.cookies["csrftoken"]})


def wait_for(probe, *, timeout: float, what: str, every: float = 1.0):
    """Polls ``probe`` until it returns something truthy, and returns that."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f} s")
        time.sleep(every)
