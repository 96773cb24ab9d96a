"""The real Codex CLI (pinned, from npm, cached outside the checkout by tests/clients/npm.py) against a
gateway in front of the shared tiny vLLM, set up from what the key page shows: its ``config.toml`` provider
block and the ``export`` line of the key.

Artifacts in test-output/<test>/: the CLI's output, every request it made to ClawHub (path, headers without
the key, body shape: no text), and every connection it tried elsewhere (refused by a local proxy, as it would
fail offline).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import turn_messages
from clawhub.keys.codex import codex_config
from tests.clients.npm import bin_path, cli_env, ensure_codex

pytestmark = pytest.mark.timeout(600)

PROMPTS = ("Say hello in one short sentence.", "Thanks. Now say goodbye.")
CLI_TIMEOUT_S = 240
# The tiny model samples at temperature 1 (Codex sets none) and ends most of its replies to Codex's prompt
# at once; Codex then has nothing to send back and that thread cannot show a link. The gateway's vLLM here
# is asked for a few tokens at least (cli_gateway below); a reply of only blank tokens is still possible, so
# a new thread is started until one shows text. An attempt takes about 1.5 s.
ATTEMPTS = 8


@pytest.fixture
def cli_gateway(cli_gateway_no_empty_replies):
    return cli_gateway_no_empty_replies


@pytest.fixture(scope="session")
def codex():
    return bin_path(ensure_codex(), "codex")


def exports(shell: str) -> dict[str, str]:
    """The variables of the ``export NAME=value`` lines of ``shell``."""
    found = {}
    for line in shell.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0]
    return found


def run(argv: list[str], env: dict, cwd, out, name: str, stdin: str = "") -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          input=stdin)
    (out / f"{name}.stdout").write_text(done.stdout)
    (out / f"{name}.stderr").write_text(done.stderr)
    (out / f"{name}.json").write_text(json.dumps({"rc": done.returncode,
                                                  "wall_s": round(time.monotonic() - started, 1)}))
    return done


def thread_id(jsonl: str) -> str:
    """The thread (conversation) id in ``codex exec --json`` output."""
    for line in jsonl.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("type") == "thread.started":
                return event["thread_id"]
    raise AssertionError(f"no thread.started event in:\n{jsonl[-2000:]}")


def test_codex_exec_sessions_are_captured_and_linked(cli_gateway, vendor_trap, cli_user, codex, tmp_path,
                                                     output_dir):
    """Two ``codex exec`` runs, the second resuming the first's thread: both turns are captured as main
    turns of one ClawHub session keyed by Codex's thread id, the second is the first's next state."""
    user, key, secret = cli_user
    shown = codex_config(key=key, secret=secret, base_url=cli_gateway.url)
    config, _, shell = shown.partition("# in the shell that runs codex")
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    (home / ".codex" / "config.toml").write_text(config)
    env = {**cli_env(codex.parents[2], home), **vendor_trap.env(), **exports(shell)}
    common = ["exec", "--skip-git-repo-check", "--strict-config", "--json"]
    spy, runs, thread = cli_gateway.gateway.spy, [], None
    for attempt in range(ATTEMPTS):
        runs.append(run([str(codex), *common, PROMPTS[0]], env, work, output_dir, f"exec-{attempt}"))
        if runs[-1].returncode != 0:
            break
        if _visible(spy.wait_for(len(cli_gateway.recorder.seen))[-1]):
            thread = thread_id(runs[-1].stdout)
            break
    if thread:
        runs.append(run([str(codex), *common, "resume", thread, PROMPTS[1]], env, work, output_dir, "resume"))
    seen = cli_gateway.recorder.seen
    (output_dir / "requests.json").write_text(json.dumps([s.summary() for s in seen], indent=2))
    (output_dir / "vendor_hosts.json").write_text(json.dumps(vendor_trap.hosts(), indent=2))
    for done in runs:
        # --strict-config: every setting the key page shows is one this Codex reads.
        assert done.returncode == 0, done.stderr[-3000:]
        assert secret not in done.stdout + done.stderr
    assert thread is not None, "the model answered nothing visible in every attempt"

    # Every request Codex made to ClawHub was a streamed Responses turn, and ClawHub served it.
    assert [(s.method, s.path, s.status) for s in seen] == [("POST", "/v1/responses", 200)] * len(seen)
    assert all(s.body["stream"] is True and s.body["store"] is False for s in seen)
    capture_store(spy.wait_for(len(seen)))
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    assert [(t.api, t.turn_type, t.status) for t in turns] == [("responses", "main", "complete")] * len(seen)
    assert all(t.token_ids and t.prompt_token_count for t in turns)  # the served sequence, for training
    # The resumed thread is one ClawHub session, keyed by Codex's thread id (its session-id header); the
    # request that said the second prompt is the next state of the turn that answered the first.
    session_turns = [t for t in turns if t.session.external_id == thread]
    second = next(t for t in session_turns if _said(t, PROMPTS[1]))
    answered = {t.pk: t for t in session_turns if _said(t, PROMPTS[0]) and not _said(t, PROMPTS[1])}
    assert second.link == "next" and second.parent_id in answered
    assert any(PROMPTS[1] in json.dumps(m) for m in answered[second.parent_id].next_state)


def _visible(record) -> bool:
    """Whether the reply had text or a tool call: something Codex keeps in the thread and sends back."""
    message = (record.choices or [{}])[0].get("message") or {}
    return bool((message.get("content") or "").strip() or message.get("tool_calls"))


def _said(turn: Turn, text: str) -> bool:
    return any(m.get("role") == "user" and text in json.dumps(m) for m in turn_messages(turn=turn) or ())
