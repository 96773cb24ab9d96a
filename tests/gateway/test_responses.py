"""OpenAI Responses <-> chat completions translation (clawhub.gateway.responses), without a server."""

from functools import partial

import orjson
import pytest

from clawhub.gateway import responses
from clawhub.gateway.errors import GatewayError, no_upstream
from tests.specs import chat_chunk

LS = '{"command": ["ls"]}'
SHELL = {"type": "function", "name": "shell", "description": "Run a command", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}


def test_a_codex_shaped_request_becomes_one_chat_request_with_replies_as_one_assistant_message():
    body = {
        "model": "clawhub-personal", "instructions": "You are Codex.", "stream": True, "store": False,
        "tools": [SHELL, {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}],
        "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "low"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "conv-1", "max_output_tokens": 300,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "xyz"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Listing."}]},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": LS},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"role": "user", "content": "thanks"},
        ],
    }
    chat = responses.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "system", "content": "sandbox"},
        {"role": "user", "content": "list files"},
        # The reply's text and its call came as two items; the chat turn they were is one message.
        {"role": "assistant", "content": "Listing.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": LS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "user", "content": "thanks"},
    ]
    # Hosted and free-form tools are not offered: nothing here runs them.
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "shell", "description": "Run a command", "parameters": SHELL["parameters"]}}]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["max_tokens"], chat["stream"]) == (
        "auto", False, 300, True)
    assert not {"reasoning", "include", "prompt_cache_key", "store", "instructions", "input"} & set(chat)


def test_a_string_input_and_a_named_tool_choice():
    chat = responses.to_chat({"model": "m", "input": "hi", "tools": [SHELL],
                              "tool_choice": {"type": "function", "name": "shell"}, "temperature": 0.2})
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "shell"}}
    assert chat["temperature"] == 0.2


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": "x", "store": True}, "store"),
    ({"model": "m", "input": "x", "background": True}, "background"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input"),
    ({"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}, "input"),
    ({"model": "m", "input": [{"type": "function_call", "name": "shell"}]}, "input"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input"),
    ({"model": "m", "instructions": "only this", "input": []}, "input"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools"),
    ({"model": "m", "input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "x", "stream": 1}, "stream"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(body, param):
    with pytest.raises(GatewayError) as caught:
        responses.to_chat(body)
    assert caught.value.status == 400 and caught.value.param == param


@pytest.mark.parametrize(("headers", "body", "expected"), [
    ({b"session_id": b"conv-h"}, {"prompt_cache_key": "other"}, "conv-h"),
    ({b"conversation_id": b"conv-c"}, {}, "conv-c"),
    ({}, {"prompt_cache_key": "conv-k"}, "conv-k"),
    ({}, {}, None),
])
def test_codexs_session_id(headers, body, expected):
    assert responses.client_session_id(headers, body) == expected


def test_a_reply_with_text_and_a_call():
    call = {"id": "call_9", "type": "function", "function": {"name": "shell", "arguments": LS}}
    message = {"role": "assistant", "content": "Running it.", "tool_calls": [call]}
    choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
    data = {"id": "resp_r1", "created": 7, "choices": [choice],
            "usage": {"prompt_tokens": 20, "completion_tokens": 6}}
    out = responses.to_response(data, "clawhub-personal")
    assert out["id"] == "resp_r1" and out["object"] == "response" and out["status"] == "completed"
    assert out["model"] == "clawhub-personal" and out["store"] is False and out["created_at"] == 7
    assert out["output"] == [
        {"type": "message", "id": "msg_r1_0", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Running it.", "annotations": []}]},
        {"type": "function_call", "id": "fc_r1_1", "call_id": "call_9", "name": "shell",
         "arguments": LS, "status": "completed"}]
    assert out["usage"]["input_tokens"] == 20 and out["usage"]["total_tokens"] == 26
    data["choices"][0] = {"index": 0, "finish_reason": "length",
                          "message": {"role": "assistant", "content": "x"}}
    cut = responses.to_response(data, "m")
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def _events(raw: bytes) -> list[dict]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            payload = orjson.loads(data[len("data: "):])
            assert name == f"event: {payload['type']}"
            out.append(payload)
    return out


_chunk = partial(chat_chunk, id="resp_s1")


def test_a_stream_of_text_then_a_call_becomes_responses_events():
    frames = responses.ResponseFrames("clawhub-personal")
    raw = b"".join([
        frames.chunk(_chunk({"role": "assistant", "content": ""})),
        frames.chunk(_chunk({"content": "On "})),
        frames.chunk(_chunk({"content": "it."})),
        frames.chunk(_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": "shell"}}]})),
        frames.chunk(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": LS}}]})),
        frames.chunk(_chunk({}, finish_reason="tool_calls")),
        frames.chunk(_chunk(usage={"prompt_tokens": 5, "completion_tokens": 4})),
        frames.done(),
    ])
    events = _events(raw)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["id"] == "resp_s1" and events[0]["response"]["status"] == "in_progress"
    assert events[6]["text"] == "On it." and events[9]["item"]["call_id"] == "call_1"
    assert events[9]["output_index"] == 1 and events[11]["arguments"] == LS
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 4
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "On it."


def test_a_cut_stream_is_incomplete_and_errors_are_events():
    frames = responses.ResponseFrames("m")
    events = _events(frames.chunk(_chunk({"content": "x"}, finish_reason="length")) + frames.done())
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    error = _events(frames.error(no_upstream()))[0]
    assert error["type"] == "error" and error["code"] == "service_unavailable"
