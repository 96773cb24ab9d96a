"""`./dev run` keeps serving when vLLM dies: the gateway answers 503 with Retry-After while it is down, the
supervisor restarts it by itself and says so, and the next chat succeeds. Runs on the shared stack."""

from __future__ import annotations

import re
import signal
import time

import httpx
import pytest

from tests.embedded.conftest import post, signed_in_client, wait_for

pytestmark = [pytest.mark.embedded, pytest.mark.timeout(900)]

BACK_TIMEOUT_S = 300  # vLLM loading the model again on two busy cores


def _vllm(stack):
    for process in stack.record_processes():
        try:
            if ".venv-vllm/bin/vllm serve" in " ".join(process.cmdline()):
                return process
        except Exception:  # gone between listing and reading
            continue
    return None


def _chat(url: str, secret: str) -> httpx.Response:
    body = {"model": "clawhub-personal", "max_tokens": 8, "messages": [{"role": "user", "content": "Back?"}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {secret}"})


def test_killed_vllm_is_restarted_and_the_next_chat_succeeds(shared_stack):
    """Minutes (140 s in a two-worker run, after the shared stack's start): vLLM is killed and the
    supervisor's restart waits for a whole new vLLM to load before the next chat."""
    stack = shared_stack.stack
    http = signed_in_client(stack.url, "restart@example.com", "a long and unusual passphrase", signup=True)
    created = post(http, "/api/keys/", {"name": "restart"})
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    assert _chat(stack.url, secret).status_code == 200

    vllm = _vllm(stack)
    assert vllm is not None
    vllm.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()

    # Down: an OpenAI-shaped 503 the client can wait out, not a hang or a 500.
    down = _chat(stack.url, secret)
    assert down.status_code == 503, down.text
    assert down.json()["error"]["code"] == "service_unavailable"
    assert int(down.headers["retry-after"]) >= 1

    wait_for(lambda: "vllm is serving again" in stack.output(), timeout=BACK_TIMEOUT_S,
             what="vLLM did not come back")
    printed = stack.output()
    assert "vllm exited with code -9; restarting it in 1 s (failure 1 of 5 allowed within 300 s)." in printed
    new_pid = int(re.search(r"vllm restarted \(pid (\d+)\)", printed).group(1))
    assert new_pid != vllm.pid and _vllm(stack).pid == new_pid
    assert stack.proc.poll() is None  # the command never stopped

    # The gateway sees it within one health interval (5 s); until then a client retries after Retry-After.
    def served():
        response = _chat(stack.url, secret)
        if response.status_code == 503:
            return None
        assert response.status_code == 200, response.text
        return response

    answer = wait_for(served, timeout=30, what="the gateway did not serve again after vLLM came back")
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    print(f"vLLM back and serving {time.monotonic() - killed_at:.0f} s after the kill")
