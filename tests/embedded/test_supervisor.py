"""The process supervisor behind `manage.py serve`: a child that exits is noticed, and stopping ends every
child's whole process group, including what the child spawned and a child that ignores SIGTERM."""

import os
import threading
import time

import psutil

from clawhub.web.supervisor import Child, start_all, stop_all, wait_any

ENV = dict(os.environ)


def bash(name: str, script: str) -> Child:
    return Child(name, ["bash", "-c", script], ENV)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_wait_any_returns_the_child_that_exited_and_stop_all_ends_its_siblings_and_their_children(tmp_path):
    grandchild_pid = tmp_path / "grandchild.pid"
    children = [
        # Like vLLM: a process that starts helpers of its own, which must die with it.
        bash("parent", f"sleep 300 & echo $! > {grandchild_pid}; wait"),
        bash("quitter", "sleep 0.5; exit 3"),
    ]
    start_all(children)
    try:
        exited = wait_any(children, stop=threading.Event(), timeout=30)
        assert exited is children[1] and exited.returncode == 3
        assert children[0].returncode is None
        grandchild = int(grandchild_pid.read_text())
        assert alive(grandchild)
    finally:
        stop_all(children, grace_seconds=5)
    assert children[0].returncode is not None
    assert not alive(grandchild)


def test_wait_any_returns_none_when_a_stop_is_asked_for():
    children = [bash("sleeper", "sleep 300")]
    stop = threading.Event()
    start_all(children)
    try:
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        assert wait_any(children, stop=stop) is None
        assert time.monotonic() - started < 5
    finally:
        stop_all(children, grace_seconds=5)
    assert children[0].returncode is not None


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period():
    children = [bash("stubborn", "trap '' TERM; while true; do sleep 0.1; done")]
    start_all(children)
    time.sleep(0.3)  # let it install the trap
    started = time.monotonic()
    stop_all(children, grace_seconds=1)
    assert children[0].returncode is not None
    assert 1 <= time.monotonic() - started < 10


def test_a_child_writes_to_its_log_file_when_it_has_one(tmp_path):
    log = tmp_path / "logs" / "child.log"
    children = [Child("talker", ["bash", "-c", "echo hello from the child"], ENV, log_path=log)]
    start_all(children)
    assert wait_any(children, stop=threading.Event(), timeout=30) is children[0]
    stop_all(children, grace_seconds=1)
    assert log.read_text() == "hello from the child\n"
