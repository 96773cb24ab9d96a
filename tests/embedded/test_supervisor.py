"""The process supervisor behind `manage.py serve`: a child that exits is noticed and restarted with back-off
(given up on after repeated failures), and stopping ends every child's whole process group, including what
the child spawned and a child that ignores SIGTERM."""

import os
import signal
import sys
import threading
import time

import psutil

from clawhub.web.supervisor import Child, RestartPolicy, Supervisor, start_all, stop_all, wait_any
from tests.ports import free_port

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


FAST = RestartPolicy(backoff_seconds=0.1, backoff_max_seconds=0.4, stable_seconds=30, max_failures=3,
                     window_seconds=60, poll_seconds=0.05)


def run_in_thread(supervisor: Supervisor, stop: threading.Event) -> dict:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(gave_up=supervisor.run(stop)), daemon=True)
    thread.start()
    result["thread"] = thread
    return result


def test_a_child_that_exits_is_restarted_with_backoff_and_the_restart_is_said(tmp_path):
    starts = tmp_path / "starts"
    grandchild_pid = tmp_path / "grandchild.pid"
    # Each start leaves a helper behind (like vLLM's engine): the restart must not leave the old one running.
    child = bash("flaky", f"echo x >> {starts}; sleep 300 & echo $! > {grandchild_pid}; sleep 300")
    steady = bash("steady", "sleep 300")
    said: list[str] = []
    stop = threading.Event()
    start_all([child, steady])
    try:
        time.sleep(0.3)
        first_helper = int(grandchild_pid.read_text())
        supervisor = Supervisor([child, steady], policy=FAST, say=said.append)
        result = run_in_thread(supervisor, stop)
        first_pid = child.pid
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        # The restart is said just after the new child starts: wait for both.
        while time.monotonic() < deadline and (
                child.pid == first_pid or child.returncode is not None or len(said) < 2):
            time.sleep(0.05)
        assert child.pid != first_pid and child.returncode is None
        assert said[0].startswith("flaky exited with code -9; restarting it in 0 s (failure 1 of 3 allowed")
        assert said[1] == f"flaky restarted (pid {child.pid})."
        assert not alive(first_helper)  # the old group was killed before the restart
        assert steady.returncode is None  # the others were left alone
        stop.set()
        result["thread"].join(10)
        assert result["gave_up"] is None
    finally:
        stop.set()
        stop_all([child, steady], grace_seconds=5)
    assert len(starts.read_text().split()) == 2


def test_repeated_failures_within_the_window_give_up_and_return_the_child():
    quitter = bash("quitter", "sleep 0.1; exit 4")
    said: list[str] = []
    stop = threading.Event()
    start_all([quitter])
    try:
        started = time.monotonic()
        assert Supervisor([quitter], policy=FAST, say=said.append).run(stop) is quitter
        assert time.monotonic() - started < 20
    finally:
        stop_all([quitter], grace_seconds=5)
    # 1st and 2nd failure restart it (0.1 s, then 0.2 s), the 3rd within the window gives up.
    assert [line.split(";")[0].split(":")[0] for line in said if "exited" in line] == [
        "quitter exited with code 4"] * 3
    assert said[-1] == "quitter exited with code 4: 3 failures within 60 s; giving up."
    assert "restarting it in 0 s (failure 2 of 3" in said[2]


def test_a_restarted_child_with_a_health_url_is_reported_once_it_answers(tmp_path):
    port = free_port()
    child = Child("server", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(tmp_path)], ENV, health_url=f"http://127.0.0.1:{port}/")
    said: list[str] = []
    stop = threading.Event()
    start_all([child])
    try:
        result = run_in_thread(Supervisor([child], policy=FAST, say=said.append), stop)
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not any("serving again" in line for line in said) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any(line.startswith("server is serving again (") for line in said), said
        stop.set()
        result["thread"].join(10)
    finally:
        stop.set()
        stop_all([child], grace_seconds=5)
