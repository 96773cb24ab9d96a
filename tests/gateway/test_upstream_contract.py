"""Keeps the fake upstream honest: the same assertions run against it and against real vLLM.

Every other gateway test trusts clawhub.devtools.fake_upstream to answer like vLLM; when vLLM changes (or the
fake drifts), this file fails for the fake or for vLLM, and says which. Requests go straight to the upstream,
not through the gateway: the shapes checked here are what the gateway has to cope with.
"""

import uuid
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.specs import NAMED_WEATHER as NAMED
from tests.specs import WEATHER_DESCRIBED as WEATHER
from tests.specs import WEATHER_MSGS

MSGS = [{"role": "user", "content": "Tell me about pencils."}]


@dataclass
class Upstream:
    kind: str
    url: str
    model: str
    adapter_path: str

    def post(self, path: str, body: dict | None = None, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=120, **kwargs)

    def chat(self, **fields) -> httpx.Response:
        return self.post("/v1/chat/completions", {"model": self.model, "messages": MSGS, "temperature": 0,
                                                  "max_tokens": 4, **fields})

    def events(self, path: str, body: dict) -> list[bytes]:
        """The SSE data payloads of a stream, [DONE] included."""
        response = self.post(path, {"model": self.model, "temperature": 0, "max_tokens": 4, "stream": True,
                                    **body})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.content.split(b"\n") if line]
        assert all(line.startswith(b"data: ") for line in lines)
        return [line[6:] for line in lines]


@pytest.fixture(params=["fake", pytest.param("vllm", marks=pytest.mark.vllm)])
def upstream(request, lora_adapters) -> Upstream:
    if request.param == "fake":
        url = request.getfixturevalue("fake").url
    else:
        url = request.getfixturevalue("vllm_server").base_url
    return Upstream(request.param, url, "tiny", str(lora_adapters["a"]))


def assert_vllm_error(response: httpx.Response, status: int, param=None) -> str:
    """vLLM's error shape: OpenAI's keys, but a class name for type and the HTTP status as code."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and isinstance(error["type"], str) and error["param"] == param
    return error["message"]


def test_chat_with_logprobs_and_token_ids(upstream):
    data = upstream.chat(logprobs=True, top_logprobs=2, extra_field_vllm_ignores=1,
                         return_token_ids=True).json()
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    assert data["model"] == upstream.model and isinstance(data["created"], int)
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    choice = data["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert "tool_calls" not in choice["message"]
    entries = choice["logprobs"]["content"]
    assert {"token", "logprob", "bytes", "top_logprobs"} <= set(entries[0])
    assert len(entries[0]["top_logprobs"]) == 2
    assert len(choice["token_ids"]) == len(entries) == usage["completion_tokens"]
    assert all(isinstance(i, int) for i in choice["token_ids"])
    assert len(data["prompt_token_ids"]) == usage["prompt_tokens"]


def test_chat_without_extras_has_null_training_fields(upstream):
    data = upstream.chat().json()
    choice = data["choices"][0]
    assert choice["logprobs"] is None and choice["token_ids"] is None and data["prompt_token_ids"] is None


def test_completions_with_logprobs_and_token_ids(upstream):
    response = upstream.post("/v1/completions", {"model": upstream.model, "prompt": "Once upon",
                                                 "max_tokens": 3, "temperature": 0, "logprobs": 1,
                                                 "return_token_ids": True})
    data = response.json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    choice = data["choices"][0]
    assert isinstance(choice["text"], str)
    lp = choice["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == data["usage"]["completion_tokens"]
    assert all(isinstance(top, dict) and len(top) >= 1 for top in lp["top_logprobs"])
    # Unlike chat, /v1/completions carries the prompt's ids in the choice.
    assert len(choice["token_ids"]) == data["usage"]["completion_tokens"]
    assert len(choice["prompt_token_ids"]) == data["usage"]["prompt_tokens"]
    assert "prompt_token_ids" not in data


def test_chat_stream_with_usage_logprobs_and_token_ids(upstream):
    events = upstream.events("/v1/chat/completions", {"messages": MSGS, "logprobs": True,
                                                      "return_token_ids": True,
                                                      "stream_options": {"include_usage": True}})
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert all(c["model"] == upstream.model for c in chunks)
    first, usage_chunk = chunks[0], chunks[-1]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert len(first["prompt_token_ids"]) == usage_chunk["usage"]["prompt_tokens"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    body = [c["choices"][0] for c in chunks[:-1]]
    token_ids = [i for ch in body for i in (ch.get("token_ids") or [])]
    logprobs = [e for ch in body if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert len(token_ids) == len(logprobs) == usage_chunk["usage"]["completion_tokens"]
    assert [ch["finish_reason"] for ch in body].count(None) == len(body) - 1
    assert body[-1]["finish_reason"] in ("stop", "length")


def test_chat_stream_without_include_usage_has_no_usage(upstream):
    events = upstream.events("/v1/chat/completions", {"messages": MSGS})
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert events[-1] == b"[DONE]" and all(c["choices"] for c in chunks)
    assert all(c.get("usage") is None for c in chunks)
    assert all(ch.get("token_ids") is None and ch["logprobs"] is None for c in chunks for ch in c["choices"])


def test_completions_stream(upstream):
    events = upstream.events("/v1/completions", {"prompt": "Once", "return_token_ids": True,
                                                 "stream_options": {"include_usage": True}})
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    usage = chunks[-1]["usage"]
    body = [c["choices"][0] for c in chunks[:-1]]
    assert all(isinstance(ch["text"], str) for ch in body)
    assert sum(len(ch["token_ids"] or []) for ch in body) == usage["completion_tokens"]
    assert len(body[0]["prompt_token_ids"]) == usage["prompt_tokens"]


def test_tool_call_to_a_named_function(upstream):
    data = upstream.chat(messages=WEATHER_MSGS, tools=[WEATHER], tool_choice=NAMED, max_tokens=40).json()
    choice = data["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert set(call) == {"id", "type", "function"} and call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather" and isinstance(call["function"]["arguments"], str)
    # A named function ends with "stop" (guided decoding), and content is "" rather than null.
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""


def test_tool_call_stream(upstream):
    events = upstream.events("/v1/chat/completions", {"messages": WEATHER_MSGS, "tools": [WEATHER],
                                                      "tool_choice": NAMED, "max_tokens": 40})
    chunks = [orjson.loads(e) for e in events[:-1]]
    deltas = [tc for c in chunks for ch in c["choices"] for tc in (ch["delta"].get("tool_calls") or [])]
    head, rest = deltas[0], deltas[1:]
    assert head["id"] and head["type"] == "function" and head["index"] == 0
    assert head["function"]["name"] == "get_weather"
    assert rest and all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_adapter_load_double_load_unload_and_missing(upstream):
    name = f"contract-{uuid.uuid4().hex[:8]}"
    loaded = upstream.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": upstream.adapter_path})
    assert loaded.status_code == 200 and name in loaded.text
    try:
        listed = {m["id"]: m for m in httpx.get(f"{upstream.url}/v1/models").json()["data"]}
        assert listed[name]["parent"] == upstream.model and listed[name]["root"] == upstream.adapter_path
        assert listed[upstream.model]["parent"] is None
        answer = upstream.post("/v1/chat/completions", {"model": name, "messages": MSGS, "max_tokens": 2})
        assert answer.status_code == 200 and answer.json()["model"] == name

        again = upstream.post("/v1/load_lora_adapter",
                              {"lora_name": name, "lora_path": upstream.adapter_path})
        # The gateway treats this as "another worker loaded it first": it looks for "already".
        assert "already" in assert_vllm_error(again, 400)
    finally:
        unloaded = upstream.post("/v1/unload_lora_adapter", {"lora_name": name})
    assert unloaded.status_code == 200
    assert name in assert_vllm_error(upstream.post("/v1/unload_lora_adapter", {"lora_name": name}), 404)
    missing = upstream.post("/v1/load_lora_adapter",
                            {"lora_name": f"{name}-x", "lora_path": "/nonexistent/missing"})
    assert_vllm_error(missing, 404)


def test_error_shapes(upstream):
    unknown = upstream.chat(model="no-such-model")
    message = assert_vllm_error(unknown, 404, param="model")
    # It lists the names the server knows: the gateway must never pass this on (errors._sanitise).
    assert "no-such-model" in message and upstream.model in message

    assert_vllm_error(upstream.chat(stream_options={"include_usage": True}), 400, param="stream_options")
    bad = upstream.post("/v1/chat/completions", content=b"{nope",
                        headers={"content-type": "application/json"})
    assert_vllm_error(bad, 400, param="body.1")
    no_messages = upstream.post("/v1/chat/completions", {"model": upstream.model})
    assert_vllm_error(no_messages, 400, param="body.messages")
