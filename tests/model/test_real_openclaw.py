"""The real OpenClaw CLI (pinned, from npm; tests/openclaw/install.py) on the default model,
SmolLM2-135M-Instruct, served as ./dev run serves it (the shared ``real_vllm_server``) behind a gateway,
configured from the JSON block a key shows: two ``openclaw agent --local`` turns of one OpenClaw session, a
factual question and a follow-up.

What the model's description gives OpenClaw: its 16,384-token context, no tool schemas (its chat template has
no tool format: ``compat.supportsTools: false``) and a bounded output. Asserted: every turn answers with text
(no "Agent couldn't generate a response"), every request OpenClaw made was served, streamed and sent no tools,
and capture holds the two turns as one session, the second the first's next state. Not asserted: what the
answers say. Inside OpenClaw's own system prompt (about 6,800 tokens on a new workspace, which OpenClaw writes
and no setting replaces) this 135M model answers few simple questions; the answers and whether they name the
expected city are written to the artifacts.

Artifacts in test-output/<test>/: each CLI run's stdout and stderr, the config OpenClaw used (key masked),
timings.json (OpenClaw's wall time per turn; per request the prompt tokens, the gateway's time to first token
— the first turn's is the prefill of OpenClaw's whole prompt — and total) and answers.json.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.keys.openclaw import openclaw_provider_config
from tests.clients.traffic import Recorder
from tests.factories import make_key, make_user
from tests.gateway.conftest import forget_tenant_adapters, gateway_factory  # noqa: F401
from tests.openclaw.install import ensure_openclaw

pytestmark = pytest.mark.timeout(900)

QUESTIONS = (("What is the capital of France?", "Paris"), ("And what is the capital of Italy?", "Rome"))
CLI_TIMEOUT_S = 400  # Node loading OpenClaw, then the prefill of a 6,800-token prompt on two busy cores
# The operator's output limit (CLAWHUB_MODEL_MAX_TOKENS) for this test: with the description's 512 tokens, a
# reply that does not stop (this model's habit inside OpenClaw's prompt) takes one to two minutes here.
MAX_TOKENS = 96


def _run(claw, home, out, name: str, message: str) -> dict:
    started = time.monotonic()
    done = subprocess.run(["openclaw", "agent", "--local", "--json", "--message", message],
                          env=claw.env(home), cwd=home, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    (out / f"{name}.stdout").write_text(done.stdout)
    (out / f"{name}.stderr").write_text(done.stderr)
    return {"rc": done.returncode, "wall_s": round(time.monotonic() - started, 1), "stdout": done.stdout,
            "stderr": done.stderr}


def test_openclaw_on_the_default_model_answers_every_turn_and_is_captured(
        real_vllm_server, gateway_factory, settings, tmp_path, output_dir):  # noqa: F811
    settings.CLAWHUB_BASE_MODEL, settings.CLAWHUB_START_VLLM = str(real_vllm_server.model_dir), True
    settings.CLAWHUB_VLLM_ARGS, settings.MODEL_CONTEXT_WINDOW = "", None
    settings.MODEL_MAX_TOKENS = MAX_TOKENS
    forget_tenant_adapters(real_vllm_server.base_url)
    recorder = Recorder()
    gateway = gateway_factory([real_vllm_server.base_url], base_model=real_vllm_server.model,
                              wrap=recorder.wrapping)
    user = make_user()
    key, secret = make_key(user)
    config = openclaw_provider_config(key=key, secret=secret, base_url=gateway.url)
    for model in config["models"]["providers"]["clawhub"]["models"]:  # the base model and the user's adapter
        assert model["compat"] == {"supportsTools": False}
        assert (model["contextWindow"], model["maxTokens"]) == (16384, MAX_TOKENS)
    home = tmp_path / "home"
    (home / ".openclaw").mkdir(parents=True)
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config, indent=2))
    (output_dir / "openclaw.json").write_text(json.dumps(config, indent=2).replace(secret, "<secret>"))

    claw = ensure_openclaw()
    runs = [_run(claw, home, output_dir, f"agent-{i}", question) for i, (question, _) in enumerate(QUESTIONS)]
    seen = recorder.seen
    records = gateway.spy.wait_for(len(seen))
    capture_store(records)
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    answers = []
    for run, (question, expected) in zip(runs, QUESTIONS, strict=True):
        assert secret not in run["stdout"] + run["stderr"]
        assert run["rc"] == 0, run["stderr"][-3000:]
        payloads = json.loads(run["stdout"])["payloads"]
        text = "\n".join(p.get("text") or "" for p in payloads)
        answers.append({"question": question, "answer": text, "names_" + expected: expected in text})
        assert text.strip() and not any(p.get("isError") for p in payloads), payloads
        assert "couldn't generate" not in text.lower(), text
    (output_dir / "answers.json").write_text(json.dumps(answers, indent=2))
    (output_dir / "timings.json").write_text(json.dumps({
        "openclaw_wall_s": [run["wall_s"] for run in runs],
        "requests": [{"prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
                      "ttft_ms": t.ttft_ms, "latency_ms": t.latency_ms} for t in turns]}, indent=2))

    # Every request OpenClaw made was served, streamed, with no tool schemas and the configured output limit.
    assert [(s.method, s.path, s.status) for s in seen] == [("POST", "/v1/chat/completions", 200)] * len(seen)
    assert all(s.body["stream"] is True and not s.body.get("tools") for s in seen)
    assert {s.body.get("max_completion_tokens") for s in seen} == {MAX_TOKENS}
    # One session, keyed by OpenClaw's own session id; the second question is the first turn's next state.
    main = [t for t in turns if t.turn_type == "main"]
    assert len(main) == len(QUESTIONS) and all(t.status == "complete" and t.token_ids for t in main)
    [session_id] = {json.loads(run["stdout"])["meta"]["agentMeta"]["sessionId"] for run in runs}
    assert {t.session.external_id for t in main} == {session_id}
    assert main[1].link == "next" and main[1].parent_id == main[0].pk
    assert QUESTIONS[1][0] in json.dumps(main[0].next_state)
