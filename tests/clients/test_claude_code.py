"""The real Claude Code (pinned, from npm, cached outside the checkout by tests/clients/npm.py) against a
gateway in front of the shared tiny vLLM, set up from what the key page shows: its environment variables.

Artifacts in test-output/<test>/: the CLI's output, every request it made to ClawHub (path, headers without
the key, body shape: no text), and every connection it tried elsewhere (refused by a local proxy, as it would
fail offline).
"""

from __future__ import annotations

import json

import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import turn_messages
from clawhub.core.model_limits import served_limits
from clawhub.keys.claude_code import claude_code_env
from tests.clients.npm import bin_path, cli_env, ensure_claude_code
from tests.clients.test_codex import exports, run

pytestmark = pytest.mark.timeout(600)

PROMPTS = ("Say hello in one short sentence.", "Thanks. Now say goodbye.")
# Claude Code's own tools are left out (``--tools ""``): with its 12 tools (32 KB of definitions, a
# 14,500-token prompt) the tiny test model answers nothing at all, and Claude Code drops an empty reply from
# the history (it asks again, "Your previous response had no visible output"), so no turn could show a next
# state. Without them the prompt is 4,800 tokens and about nine replies in ten have text (Claude Code asks
# again after an empty one). The tool-laden request's shape is covered by tests/gateway/test_messages.py.
ARGV = ["-p", "--tools", "", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]


@pytest.fixture(scope="session")
def claude():
    return bin_path(ensure_claude_code(), "claude")


def _said(turn: Turn, text: str) -> bool:
    return any(m.get("role") == "user" and text in json.dumps(m) for m in turn_messages(turn=turn) or ())


def test_claude_code_print_mode_turns_are_captured_and_linked(cli_gateway, vendor_trap, cli_user, claude,
                                                               tmp_path, output_dir):
    """One ``claude -p`` run, two user messages (stream-json input): every request it makes reaches ClawHub
    as a Messages turn of one session keyed by Claude Code's session id, and the request with the second
    message is the next state of the turn that answered the first."""
    user, key, secret = cli_user
    shown = claude_code_env(key=key, secret=secret, base_url=cli_gateway.url)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {**cli_env(claude.parents[2], home), **vendor_trap.env(), **exports(shown)}
    said = "".join(json.dumps({"type": "user", "message": {"role": "user", "content": prompt}}) + "\n"
                   for prompt in PROMPTS)
    done = run([str(claude), *ARGV], env, work, output_dir, "print", stdin=said)
    seen = cli_gateway.recorder.seen
    (output_dir / "requests.json").write_text(json.dumps([s.summary() for s in seen], indent=2))
    (output_dir / "vendor_hosts.json").write_text(json.dumps(vendor_trap.hosts(), indent=2))
    assert done.returncode == 0, done.stderr[-3000:]
    assert secret not in done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    results = [e for e in events if e.get("type") == "result"]
    assert len(results) == 2 and not any(r["is_error"] for r in results), results
    [session_id] = {e["session_id"] for e in events if e.get("session_id")}
    # The context the key page gives it is the one it plans with (not its 1,000,000 for a model it does not
    # know), and the output cap the one it asks for.
    model = exports(shown)["ANTHROPIC_MODEL"]
    assert results[-1]["modelUsage"][model]["contextWindow"] == served_limits().context_window
    assert {s.body["max_tokens"] for s in seen} == {served_limits().max_tokens}

    # Every request it made was a streamed Messages turn, served; none went anywhere else on ClawHub.
    assert {(s.method, s.path, s.query, s.status) for s in seen} == {
        ("POST", "/v1/messages", "beta=true", 200)}
    assert all(s.body["stream"] is True and s.headers["x-claude-code-session-id"] == session_id for s in seen)
    capture_store(cli_gateway.gateway.spy.wait_for(len(seen)))
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    assert [(t.api, t.turn_type, t.status) for t in turns] == [("messages", "main", "complete")] * len(seen)
    assert {t.session.external_id for t in turns} == {session_id}
    assert all(t.token_ids and t.prompt_token_count for t in turns)  # the served sequence, for training
    second = next(t for t in turns if _said(t, PROMPTS[1]))
    answered = {t.pk: t for t in turns if _said(t, PROMPTS[0]) and not _said(t, PROMPTS[1])}
    assert second.link == "next" and second.parent_id in answered
    assert any(PROMPTS[1] in json.dumps(m) for m in answered[second.parent_id].next_state)
