import threading
import time

import httpx
import pytest

from tests.judge.fake_openai import FakeOpenAI, prm_or_hint
from workers.judge import PROMPT_VERSION, JudgeError, JudgeInput, LLMJudge, TransientJudgeError

TURN = JudgeInput(
    messages=[{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "List three fruits."}],
    response={"role": "assistant", "content": "**Apple**, **pear**, **plum**."},
    next_state=[{"role": "user", "content": "No bold please. I said plain text."}],
    tools=[{"type": "function", "function": {"name": "search", "description": "Web search"}}],
)
HINT = "[HINT_START]Write the answer as plain text without bold markup.[HINT_END]\n\\boxed{1}"


def chat(text: str, status: int = 200) -> httpx.Response:
    message = {"role": "assistant", "content": text}
    return httpx.Response(status, json={"choices": [{"index": 0, "message": message}]})


class Scripted:
    """A MockTransport handler: PRM requests get the next scripted answer, hint requests get ``hint``."""

    def __init__(self, prm: list, hint: str = HINT, delay: float = 0.0):
        self.prm = list(prm)
        self.hint = hint
        self.delay = delay
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        with self._lock:
            self.bodies.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            prompt = body["messages"][-1]["content"]
            answer = self.hint if "[HINT_START]" in prompt else self.prm.pop(0)
        try:
            time.sleep(self.delay)
            if isinstance(answer, Exception):
                raise answer
            if isinstance(answer, int):
                return httpx.Response(answer, json={"error": {"message": "nope"}})
            return chat(answer)
        finally:
            with self._lock:
                self.in_flight -= 1


def judge_with(handler, **kwargs) -> LLMJudge:
    kwargs.setdefault("retry_backoff", 0.0)
    return LLMJudge(base_url="http://judge.test/v1", model="base", transport=httpx.MockTransport(handler),
                    **kwargs)


def test_majority_of_three_votes_and_one_accepted_hint():
    handler = Scripted([r"(b) correction \boxed{-1}", r"(b) \boxed{-1}", r"(a) \boxed{1}"])
    result = judge_with(handler).judge(TURN)
    assert result.reward == -1
    assert sorted(v.score for v in result.votes) == [-1, -1, 1]
    assert result.hints == ["Write the answer as plain text without bold markup."]
    assert result.judge == "llm" and result.prompt_version == PROMPT_VERSION
    assert len(result.raw_outputs["prm"]) == 3 and result.raw_outputs["hint"] == [HINT]
    assert len(handler.bodies) == 4
    body = handler.bodies[0]
    assert body["model"] == "base" and body["temperature"] == 0.6 and body["stream"] is False
    prompt = body["messages"][0]["content"]
    # The prompt carries the turn and, as evidence, its next state.
    assert "List three fruits." in prompt and "**Apple**" in prompt and "I said plain text." in prompt
    assert "search" in prompt


def test_invalid_votes_give_zero_and_keep_the_raw_text():
    handler = Scripted(["I am not sure.", r"\boxed{maybe}", "gibberish"], hint="no markers \\boxed{1}")
    result = judge_with(handler).judge(TURN)
    assert result.reward == 0
    assert [v.score for v in result.votes] == [None, None, None]
    # The votes are asked for at once, so which vote got which scripted answer depends on the threads.
    assert sorted(result.raw_outputs["prm"]) == sorted(["I am not sure.", r"\boxed{maybe}", "gibberish"])
    assert result.hints == []


def test_tie_gives_zero():
    result = judge_with(Scripted([r"\boxed{1}", r"\boxed{-1}", "nothing"])).judge(TURN)
    assert result.reward == 0


def test_hint_is_dropped_when_the_hint_judge_says_no_hindsight():
    hint = "[HINT_START]Some long enough hint text.[HINT_END] \\boxed{-1}"
    handler = Scripted([r"\boxed{1}"] * 3, hint=hint)
    assert judge_with(handler).judge(TURN).hints == []


def test_hint_judge_asked_k_times_keeps_distinct_hints():
    hints = iter(["[HINT_START]Use plain text, no bold.[HINT_END]\\boxed{1}",
                  "[HINT_START]Use plain text, no bold.[HINT_END]\\boxed{1}",
                  "[HINT_START]Keep the list on one line.[HINT_END]\\boxed{1}"])
    lock = threading.Lock()

    def handler(request):
        if b"HINT_START" in request.content:
            with lock:
                return chat(next(hints))
        return chat(r"\boxed{-1}")

    result = judge_with(handler, hint_votes=3).judge(TURN)
    assert sorted(result.hints) == ["Keep the list on one line.", "Use plain text, no bold."]


def test_closed_turn_is_not_sent_to_the_model():
    handler = Scripted([])
    closed = JudgeInput(messages=TURN.messages, response=TURN.response, next_state=None)
    result = judge_with(handler).judge(closed)
    assert result.reward == 0 and result.votes == [] and handler.bodies == []


@pytest.mark.parametrize("failure", [503, 429, 500, httpx.ConnectError("refused"), httpx.ReadTimeout("slow")])
def test_transient_errors_are_retried(failure):
    handler = Scripted([failure, failure, r"\boxed{1}", r"\boxed{1}", r"\boxed{1}"])
    result = judge_with(handler, max_retries=3).judge(TURN)
    assert result.reward == 1
    assert len(handler.bodies) == 4 + 2  # two failed attempts, then three votes and the hint


def test_retries_are_bounded():
    handler = Scripted([503] * 20)
    with pytest.raises(TransientJudgeError):
        judge_with(handler, votes=1, hint_votes=0, max_retries=2).judge(TURN)
    assert len(handler.bodies) == 3


def test_client_errors_are_not_retried():
    handler = Scripted([400])
    with pytest.raises(JudgeError) as caught:
        judge_with(handler, votes=1, hint_votes=0, max_retries=3).judge(TURN)
    assert not isinstance(caught.value, TransientJudgeError)
    assert len(handler.bodies) == 1


def test_votes_run_concurrently():
    handler = Scripted([r"\boxed{1}"] * 3, delay=0.3)
    started = time.monotonic()
    judge_with(handler, concurrency=8).judge(TURN)
    assert handler.max_in_flight == 4
    assert time.monotonic() - started < 0.3 * 4 * 0.75


def test_concurrency_limit_holds_across_turns_judged_at_once():
    handler = Scripted([r"\boxed{1}"] * 30, delay=0.05)
    judge = judge_with(handler, votes=5, hint_votes=1, concurrency=3)
    threads = [threading.Thread(target=judge.judge, args=(TURN,)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(handler.bodies) == 30
    assert handler.max_in_flight == 3


def test_against_a_real_http_server_with_api_key():
    with FakeOpenAI(prm_or_hint(r"(b) \boxed{-1}", HINT)) as server:
        judge = LLMJudge(base_url=server.base_url, model="tiny", api_key="sk-judge", retry_backoff=0.0)
        server.fail_next = [502]
        try:
            result = judge.judge(TURN)
        finally:
            judge.close()
    assert result.reward == -1
    assert result.hints == ["Write the answer as plain text without bold markup."]
    assert len(server.requests) == 5  # one 502 retried
    assert server.headers[0]["Authorization"] == "Bearer sk-judge"
