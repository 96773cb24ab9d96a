"""Anthropic Messages <-> chat completions translation (clawhub.gateway.messages), without a server."""

from functools import partial

import orjson
import pytest

from clawhub.gateway import messages
from clawhub.gateway.errors import GatewayError, invalid_key, no_upstream
from tests.specs import chat_chunk

TOOLS = [{"name": "read", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def test_a_claude_code_shaped_request_becomes_the_chat_request_vllm_would_serve():
    body = {
        "model": "clawhub-personal", "max_tokens": 32000, "stream": True, "temperature": 0.5, "top_k": 20,
        "stop_sequences": ["</done>"], "metadata": {"user_id": "x"},
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=4f1a;"},
                   {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [*TOOLS, {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "show a.txt"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use read", "signature": "sig"},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.txt"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "hi"}]},
                {"type": "text", "text": "and now?"}]},
        ],
    }
    chat = messages.to_chat(body)
    assert chat["messages"] == [
        # The billing line (a per-request hash) is dropped: it would change every request's prompt.
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "show a.txt"},
        {"role": "assistant", "content": "Reading it.", "reasoning": "use read", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "read", "arguments": '{"path":"a.txt"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "hi"},
        {"role": "user", "content": "and now?"},
    ]
    # The server tool (web search runs at Anthropic) is not offered; the client's own tool is.
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "read", "description": "Read a file", "parameters": TOOLS[0]["input_schema"]}}]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False
    assert (chat["max_tokens"], chat["stream"], chat["temperature"], chat["top_k"]) == (32000, True, 0.5, 20)
    assert chat["stop"] == ["</done>"] and "metadata" not in chat and "system" not in chat


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "read"}, {"type": "function", "function": {"name": "read"}}),
])
def test_tool_choice(choice, expected):
    chat = messages.to_chat({"model": "m", "max_tokens": 5, "tools": TOOLS, "tool_choice": choice,
                             "messages": [{"role": "user", "content": "x"}]})
    assert chat["tool_choice"] == expected


def test_images_become_image_urls_and_identity_fields_are_kept_for_the_chat_path():
    chat = messages.to_chat({"model": "m", "max_tokens": 5, "session_id": "s1", "turn_type": "side",
                             "messages": [{"role": "user", "content": [
                                 {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                              "data": "AAAA"}},
                                 {"type": "text", "text": "what is it?"}]}]})
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "what is it?"}]
    assert (chat["session_id"], chat["turn_type"]) == ("s1", "side")


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}, "model"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": [], "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}], "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "document"}]}], "max_tokens": 5},
     "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}], "max_tokens": 5},
     "messages"),
    ({"model": "m", "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "read", "input": "a.txt"}]}], "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "system": 3}, "system"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "tools": [{}]}, "tools"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
      "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "top_k": 1.5}, "top_k"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": "yes"},
     "stream"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
      "stop_sequences": "END"}, "stop_sequences"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(body, param):
    with pytest.raises(GatewayError) as caught:
        messages.to_chat(body)
    assert caught.value.status == 400 and caught.value.param == param
    assert messages.error_payload(caught.value) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": caught.value.message}}


def test_count_tokens_bodies_need_no_max_tokens():
    chat = messages.to_chat({"model": "m", "system": "be brief",
                             "messages": [{"role": "user", "content": "x"}]}, count_only=True)
    assert chat == {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "x"}]}


@pytest.mark.parametrize(("err", "kind"), [
    (invalid_key(), "authentication_error"), (GatewayError(403, "no"), "permission_error"),
    (GatewayError(404, "no"), "not_found_error"), (GatewayError(429, "slow"), "rate_limit_error"),
    (GatewayError(413, "big"), "request_too_large"), (no_upstream(), "overloaded_error"),
    (GatewayError(502, "bad"), "api_error"),
])
def test_errors_are_anthropic_shaped(err, kind):
    assert orjson.loads(messages.error_body(err)) == {"type": "error",
                                                      "error": {"type": kind, "message": err.message}}


def _reply(message: dict, finish_reason: str, **choice) -> dict:
    return {"id": "msg_abc", "model": "clawhub-personal", "choices": [
        {"index": 0, "message": message, "finish_reason": finish_reason, **choice}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}


def test_a_text_reply():
    out = messages.to_message(_reply({"role": "assistant", "content": "Hello."}, "stop"), "clawhub-personal")
    assert out == {"id": "msg_abc", "type": "message", "role": "assistant", "model": "clawhub-personal",
                   "content": [{"type": "text", "text": "Hello."}], "stop_reason": "end_turn",
                   "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 3}}


def test_a_tool_call_reply_and_stop_reasons():
    call = {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "read",
                                                                       "arguments": '{"path": "a.txt"}'}}
    out = messages.to_message(
        _reply({"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls"), "m")
    assert out["content"] == [{"type": "tool_use", "id": "chatcmpl-tool-1", "name": "read",
                               "input": {"path": "a.txt"}}]
    assert out["stop_reason"] == "tool_use"
    # A call whose arguments are not a JSON object stays text: no client runs a broken call.
    broken = {**call, "function": {"name": "read", "arguments": '{"path": '}}
    out = messages.to_message(
        _reply({"role": "assistant", "content": None, "tool_calls": [broken]}, "stop"), "m")
    assert out["content"][0]["type"] == "text" and "<tool_call>" in out["content"][0]["text"]
    assert out["stop_reason"] == "end_turn"
    assert messages.to_message(_reply({"role": "assistant", "content": "x"}, "length"), "m")["stop_reason"] \
        == "max_tokens"
    stopped = messages.to_message(
        _reply({"role": "assistant", "content": "x"}, "stop", stop_reason="END"), "m")
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    empty = messages.to_message(_reply({"role": "assistant", "content": ""}, "stop"), "m")
    assert empty["content"] == [{"type": "text", "text": ""}]


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            payload = orjson.loads(data[6:])
            assert payload["type"] == name[7:]
            out.append((name[7:], payload))
    return out


_chunk = partial(chat_chunk, id="msg_1", model="m")


def test_a_stream_of_text_then_a_tool_call_becomes_anthropic_events():
    frames = messages.MessageFrames("clawhub-personal")
    raw = b"".join([
        frames.chunk(_chunk({"role": "assistant", "content": ""}), prompt_tokens=7),
        frames.chunk(_chunk({"content": "Let me "})),
        frames.chunk(_chunk({"content": "look."})),
        frames.chunk(_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": "read"}}]})),
        frames.chunk(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a"}'}}]})),
        frames.chunk(_chunk({}, finish_reason="tool_calls")),
        frames.chunk(_chunk(usage={"prompt_tokens": 7, "completion_tokens": 9})),
        frames.done(),
    ])
    events = _events(raw)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert (start["id"], start["model"], start["usage"]["input_tokens"]) == ("msg_1", "clawhub-personal", 7)
    assert events[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "look."}
    assert events[5][1]["index"] == 1 and events[5][1]["content_block"]["name"] == "read"
    assert events[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"path": "a"}'}
    assert events[8][1] == {"type": "message_delta",
                            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                            "usage": {"input_tokens": 7, "output_tokens": 9}}


def test_a_stream_without_a_usage_chunk_still_ends_properly_and_errors_are_events():
    frames = messages.MessageFrames("m")
    raw = frames.chunk(_chunk({"content": "hi"}, finish_reason="length")) + frames.done()
    names = [name for name, _ in _events(raw)]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert _events(raw)[4][1]["delta"]["stop_reason"] == "max_tokens"
    assert _events(frames.error(no_upstream())) == [
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": no_upstream().message}})]


@pytest.mark.parametrize(("headers", "metadata", "expected"), [
    ({b"x-claude-code-session-id": b"5b7e-hdr"}, {"user_id": '{"session_id": "other"}'}, "5b7e-hdr"),
    ({}, {"user_id": '{"device_id": "d", "account_uuid": "", "session_id": "54c1-json"}'}, "54c1-json"),
    ({}, {"user_id": "user_ab12_account__session_57a1-legacy"}, "57a1-legacy"),
    ({}, {"user_id": "someone"}, None),
    ({}, {"user_id": "{not json"}, None),
    ({}, None, None),
])
def test_claude_codes_session_id(headers, metadata, expected):
    body = {"metadata": metadata} if metadata is not None else {}
    assert messages.client_session_id(headers, body) == expected


def _claude_code_2_1_332(messages_: list) -> dict:
    """A request as Claude Code 2.1.332 sends it in print mode (recorded against ClawHub by
    tests/clients/test_claude_code.py; texts shortened, every field and block kept)."""
    return {
        "model": "clawhub-personal", "max_tokens": 8192, "stream": True, "messages": messages_,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.58d;"},
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "You are an agent...", "cache_control": {"type": "ephemeral"}}],
        "tools": TOOLS, "metadata": {"user_id": '{"device_id":"d0","account_uuid":"","session_id":"3e62"}'},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }


def test_claude_code_2_1_332s_requests_translate_so_the_next_one_extends_the_first():
    # Its environment comes as a system message after the first user message: a block list in the first
    # request, a string when the history is sent back. Both must become the same chat message, or the next
    # request would not extend the first turn's prompt and reply (no next state, no link).
    environment = "# Environment\nYou have been invoked in the following environment: ..."
    asked = {"role": "user", "content": [{"type": "text", "text": "<system-reminder>\n...</system-reminder>"},
                                         {"type": "text", "text": "Say hello."}]}
    first = messages.to_chat(_claude_code_2_1_332([
        asked, {"role": "system", "content": [{"type": "text", "text": environment}]}]))
    reply = {"role": "assistant", "content": "Hello."}
    second = messages.to_chat(_claude_code_2_1_332([
        asked, {"role": "system", "content": environment},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "text", "text": "Now goodbye."}]}]))
    assert second["messages"][:len(first["messages"]) + 1] == [*first["messages"], reply]
    assert first["messages"][0] == {"role": "system", "content": "You are a Claude agent.You are an agent..."}
    assert first["messages"][2] == {"role": "system", "content": environment}
    # Anthropic-only fields (adaptive thinking, context editing, effort) are not forwarded to vLLM.
    assert set(first) == {"model", "messages", "tools", "max_tokens", "stream"}
    assert messages.client_session_id({}, _claude_code_2_1_332([])) == "3e62"


TITLE_SYSTEM = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.469; cc_entrypoint=cli;"},
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "You are naming a coding session so the user can pick it out of a long list..."}]


@pytest.mark.parametrize(("body", "kind"), [
    # Claude Code 2.1.332 (interactive) names the session before each user message (recorded, texts cut).
    ({"system": TITLE_SYSTEM, "max_tokens": 8192, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<session>\nSay hello.\n</session>\n\nWrite the title in the..."}]}],
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "title"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}, "quota_probe"),
    (_claude_code_2_1_332([{"role": "user", "content": "quota"}]), None),  # a user who says "quota"
    (_claude_code_2_1_332([{"role": "user", "content": "Name this session."}]), None),
])
def test_claude_codes_side_requests_are_known_by_shape(body, kind):
    assert messages.side_kind(body) == kind


def test_a_json_schema_output_format_constrains_the_reply_through_response_format():
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
              "additionalProperties": False}
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "name it"}],
            "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": schema}}}
    assert messages.to_chat(body)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert "response_format" not in messages.to_chat({**body, "output_config": {"effort": "high"}})
    with pytest.raises(GatewayError) as refused:
        messages.to_chat({**body, "output_config": {"format": {"type": "json_schema", "schema": "x"}}})
    assert refused.value.param == "output_config"
