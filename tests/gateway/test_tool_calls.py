"""Calls only to declared tools (clawhub/gateway/tool_calls.py), and the proxy applying the rule to whole and
streamed replies."""

import orjson

from clawhub.conversations.capture.records import TurnRecord
from clawhub.gateway import tool_calls
from clawhub.gateway.proxy import StreamJoiner, Wants, _rewrite_chunk, rewrite_response

DECLARED = frozenset({"read"})


def _call(name: str, arguments: str = '{"path": "a"}', call_id: str = "c1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_declared_tools_are_the_function_names_of_a_chat_request():
    tools = [{"type": "function", "function": {"name": "read"}}, {"type": "x"}, "junk"]
    body = {"messages": [], "tools": tools}
    assert tool_calls.declared_tools(body) == {"read"}
    assert tool_calls.declared_tools({"messages": []}) == frozenset()
    assert tool_calls.declared_tools({"prompt": "hi"}) is None


def test_an_undeclared_call_becomes_text_and_the_choice_stops():
    message = {"role": "assistant", "content": "", "tool_calls": [_call("calculator", '{"x": 1}')]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    tool_calls.filter_message(message, choice, DECLARED)
    assert "tool_calls" not in message
    assert message["content"] == '<tool_call>\n{"name": "calculator", "arguments": {"x": 1}}\n</tool_call>'
    assert choice["finish_reason"] == "stop"


def test_declared_calls_stay_and_undeclared_ones_join_the_text():
    message = {"role": "assistant", "content": "Let me look.",
               "tool_calls": [_call("get_weather", "{}", "c1"), _call("read", call_id="c2")]}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    tool_calls.filter_message(message, choice, DECLARED)
    assert message["tool_calls"] == [_call("read", call_id="c2")]
    assert message["content"].startswith("Let me look.\n<tool_call>")
    assert choice["finish_reason"] == "tool_calls"


def test_a_whole_reply_through_the_proxy_calls_no_undeclared_tool():
    data = {"id": "x", "model": "tiny", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [_call("calculator")]}}]}
    record = TurnRecord(request_id="r1", route="chat", key_id=1, user_id=1, tenant_id=1, group_id=None,
                        model="base", upstream_model="tiny", adapter_version_id=None, upstream="",
                        status="complete", http_status=200, started_at=0.0, latency_ms=1.0)
    rewrite_response(data, Wants(model="base", logprobs=False, token_ids=False, usage=False,
                                 declared_tools=frozenset()), record)
    message = data["choices"][0]["message"]
    assert "tool_calls" not in message and "calculator" in message["content"]
    assert data["choices"][0]["finish_reason"] == "stop"


def _stream(chunks: list[dict], declared: frozenset[str]) -> list[dict]:
    joiner, tools = StreamJoiner(chat=True), tool_calls.ToolCallStream(declared)
    wants = Wants(model="base", logprobs=False, token_ids=False, usage=False, declared_tools=declared)
    out = []
    for chunk in chunks:
        data = orjson.dumps({"id": "x", "model": "tiny", "choices": [chunk]})
        out.append(_rewrite_chunk(data, joiner, wants, tools)["choices"][0])
    return out


def _delta_calls(index: int, name: str | None, arguments: str) -> dict:
    function = {"arguments": arguments} if name is None else {"name": name, "arguments": arguments}
    delta = {"tool_calls": [{"index": index, "function": function}]}
    return {"index": 0, "delta": delta, "finish_reason": None}


def test_a_stream_holds_back_undeclared_calls_renumbers_declared_ones_and_ends_with_the_text():
    out = _stream([
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
        _delta_calls(0, "get_weather", '{"city": '),
        _delta_calls(0, None, '"Paris"}'),
        _delta_calls(1, "read", '{"path": '),
        _delta_calls(1, None, '"a"}'),
        {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
    ], DECLARED)
    sent = [call for choice in out for call in choice["delta"].get("tool_calls", [])]
    assert {call["index"] for call in sent} == {0}  # "read", renumbered from 1
    assert [call["function"].get("name") for call in sent] == ["read", None]
    assert out[-1]["delta"]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert out[-1]["finish_reason"] == "tool_calls"  # "read" is still called


def test_a_stream_whose_only_call_is_undeclared_stops_with_text():
    out = _stream([_delta_calls(0, "calculator", "{}"),
                   {"index": 0, "delta": {}, "finish_reason": "tool_calls"}], frozenset())
    assert not any("tool_calls" in choice["delta"] for choice in out)
    assert out[-1]["finish_reason"] == "stop" and "calculator" in out[-1]["delta"]["content"]
