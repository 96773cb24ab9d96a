"""Hypothesis drives /v1/chat/completions and /v1/completions with random bodies (JSON of any shape, wrong
types, large values, other encodings, odd headers) against the fake upstream. Every answer is a proxied
success or an OpenAI-shaped 4xx, never a 5xx and never a hang. A request the gateway refuses leaves no
capture record; one it admitted that the upstream then refused (as vLLM refuses a float ``logprobs`` on
/completions) is captured as a failed turn with the status its client saw. /v1/messages (and its
count_tokens) and /v1/responses get the same with their own bodies and errors."""

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

EXAMPLES = 150
MAX_BODY = 64 * 1024
ROUTES = ("/chat/completions", "/completions")

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(),
                         st.integers(min_value=-2**70, max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), json_values),
     "content": st.one_of(st.text(max_size=200), json_values)}), max_size=3)
good_messages = st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=200)}),
                         min_size=1, max_size=3)
# The fields the gateway reads: mostly well typed (so that many requests get through to the upstream), else
# anything at all.
def _mostly(good):
    return st.one_of(good, good, good, json_values)


FIELDS = {
    "stream": _mostly(st.booleans()),
    "stream_options": _mostly(st.just({"include_usage": True})),
    "max_tokens": _mostly(st.integers(min_value=1, max_value=64)),
    "n": _mostly(st.just(1)),
    "temperature": _mostly(st.floats(min_value=0, max_value=2)),
    "logprobs": json_values, "seed": json_values, "tools": json_values, "tool_choice": json_values,
    "user": json_values, "session_id": json_values, "metadata": json_values,
}
model = _mostly(st.just("clawhub-personal"))
chat_bodies = st.fixed_dictionaries({"model": model, "messages": st.one_of(
    good_messages, good_messages, messages, json_values)}, optional=FIELDS)
completion_bodies = st.fixed_dictionaries({"model": model, "prompt": _mostly(st.text(max_size=200))},
                                          optional=FIELDS)
near_valid = st.one_of(chat_bodies, completion_bodies).flatmap(
    lambda body: st.dictionaries(st.text(max_size=10), json_values, max_size=2).map(
        lambda extra: {**extra, **body}))
bodies = st.one_of(near_valid, near_valid, near_valid, json_values)


@st.composite
def encoded(draw):
    """(bytes on the wire, content-type header or None)."""
    kind = draw(st.sampled_from(["json"] * 6 + ["utf16", "latin1", "bytes", "big", "empty"]))
    body = draw(bodies)
    if kind == "json":
        data = json.dumps(body).encode()
    elif kind == "utf16":
        data = json.dumps(body, ensure_ascii=False).encode("utf-16")
    elif kind == "latin1":
        data = json.dumps(body, ensure_ascii=False).encode("utf-8", "replace") + b"\xff\xfe\xc3"
    elif kind == "bytes":
        data = draw(st.binary(max_size=200))
    elif kind == "big":
        data = json.dumps({"model": "clawhub-personal", "prompt": "x" * draw(
            st.integers(min_value=MAX_BODY - 200, max_value=MAX_BODY + 2000))}).encode()
    else:
        data = b""
    content_type = draw(st.sampled_from(["application/json"] * 4 + [
        None, "application/json; charset=utf-16", "text/plain", "application/x-www-form-urlencoded"]))
    return data, content_type


extra_headers = st.dictionaries(
    st.sampled_from(["x-session-id", "x-openclaw-session-id", "x-request-id", "user-agent", "accept",
                     "x-clawhub-turn-type", "content-encoding", "x-api-key"]),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=60), max_size=3)


def _is_openai_error(response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error) \
        and isinstance(error["message"], str)


def _is_success(response) -> bool:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return "data:" in response.text
    try:
        return isinstance(response.json().get("choices"), list)
    except (ValueError, AttributeError):
        return False


def test_random_bodies_get_a_success_or_an_openai_4xx(gateway_factory, fake, secret):
    gateway = gateway_factory([fake.url], max_body_bytes=MAX_BODY)
    seen: dict[str, int] = {}
    proxied = 0
    answered: dict[str, list[int]] = {}  # x-request-id (the record's trace id) -> statuses the client got

    @seed(18)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(route=st.sampled_from(ROUTES), wire=encoded(), headers=extra_headers)
    def one(route, wire, headers):
        nonlocal proxied
        data, content_type = wire
        sent = {"Authorization": f"Bearer {secret}", **headers}
        if content_type:
            sent["content-type"] = content_type
        try:
            response = httpx.post(f"{gateway.v1}{route}", content=data, headers=sent, timeout=15)
        except httpx.TimeoutException:  # the gateway must answer every request, quickly on a fake upstream
            pytest.fail(f"no answer in 15 s for {route} {data[:200]!r} {sent}")
        key = f"{response.status_code}"
        seen[key] = seen.get(key, 0) + 1
        answered.setdefault(response.headers["x-request-id"], []).append(response.status_code)
        assert response.status_code < 500, (route, data[:300], sent, response.text[:500])
        if response.status_code == 200:
            assert _is_success(response), response.text[:500]
            proxied += 1
        else:
            assert 400 <= response.status_code < 500 and _is_openai_error(response), (
                response.status_code, response.text[:500], data[:300])

    one()
    # Every proxied success is captured as complete; anything else captured is a failed turn the upstream
    # refused after admission. Records are handed over off the request path: wait for the successes' and a
    # little for any other.
    gateway.spy.wait_for(proxied, timeout=30)
    time.sleep(1.0)
    refused = _captured_as_answered(list(gateway.spy.records), proxied, answered)
    print(f"\ngateway fuzz: {EXAMPLES} examples, statuses {dict(sorted(seen.items()))}, "
          f"{proxied} proxied, {refused} captured as refused by the upstream")
    assert proxied > 0 and sum(seen.values()) >= EXAMPLES


def _captured_as_answered(records, proxied: int, answered: dict[str, list[int]]) -> int:
    """Checks that the ``proxied`` successes were captured as complete turns and that any other record is a
    failed turn with the 4xx its client got (by x-request-id, the record's trace id); returns how many of
    those there are."""
    complete = [r for r in records if r.status == "complete"]
    assert len(complete) == proxied and all(200 in answered[r.trace_id] for r in complete)
    refused = [r for r in records if r.status != "complete"]
    for r in refused:
        assert r.status == "failed" and 400 <= r.http_status < 500, r
        assert r.http_status in answered[r.trace_id], r
    return len(refused)


# /v1/messages: Anthropic-shaped bodies, mostly well formed, with any JSON in any place.
good_blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _mostly(st.text(max_size=60))}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": _mostly(st.just("toolu_1")),
                           "name": _mostly(st.just("search")), "input": _mostly(st.just({"q": "x"}))}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": _mostly(st.just("toolu_1")),
                           "content": _mostly(st.text(max_size=60))}))
odd_blocks = st.fixed_dictionaries({"type": st.sampled_from(["image", "thinking", "document"])},
                                   optional={"source": json_values, "thinking": json_values})
blocks = st.lists(st.one_of(good_blocks, good_blocks, good_blocks, odd_blocks, json_values), max_size=3)
anthropic_messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system"]),
    "content": st.one_of(st.text(max_size=100), st.text(max_size=100), blocks)}), min_size=1, max_size=3)
MESSAGES_FIELDS = {
    "stream": _mostly(st.booleans()),
    "system": st.text(max_size=60), "temperature": st.floats(min_value=0, max_value=2), "top_k": json_values,
    "stop_sequences": json_values, "metadata": json_values, "tool_choice": json_values,
    "tools": _mostly(st.just([{"name": "search", "input_schema": {"type": "object"}}])),
}
messages_bodies = st.fixed_dictionaries(
    {"model": st.just("clawhub-personal"), "messages": anthropic_messages,
     "max_tokens": st.integers(min_value=0, max_value=64)}, optional=MESSAGES_FIELDS).flatmap(
        lambda body: st.dictionaries(st.text(max_size=10), json_values, max_size=2).map(
            lambda extra: {**extra, **body}))


def _is_anthropic_error(response) -> bool:
    try:
        data = response.json()
    except ValueError:
        return False
    return (isinstance(data, dict) and data.get("type") == "error"
            and isinstance(data["error"]["message"], str))


# /v1/responses: Responses-shaped bodies (Codex's input items), with any JSON in any place.
good_items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer"]),
                           "content": st.one_of(st.text(max_size=80), st.lists(st.fixed_dictionaries(
                               {"type": st.sampled_from(["input_text", "output_text"]),
                                "text": _mostly(st.text(max_size=40))}), max_size=2))}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": _mostly(st.just("call_1")),
                           "name": _mostly(st.just("search")), "arguments": _mostly(st.just('{"q": 1}'))}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _mostly(st.just("call_1")),
                           "output": _mostly(st.text(max_size=40))}))
responses_bodies = st.fixed_dictionaries(
    {"model": st.just("clawhub-personal"),
     "input": st.one_of(st.text(max_size=80),
                        st.lists(st.one_of(good_items, good_items, good_items, json_values), max_size=4))},
    optional={"instructions": _mostly(st.text(max_size=40)), "stream": _mostly(st.booleans()),
              "store": st.sampled_from([False, False, False, True]),
              "max_output_tokens": _mostly(st.integers(min_value=1, max_value=64)),
              "tools": _mostly(st.just([{"type": "function", "name": "search", "parameters": {}}])),
              "tool_choice": json_values, "reasoning": json_values,
              "previous_response_id": st.sampled_from([None, None, None, "resp_1"]),
              "prompt_cache_key": json_values}).flatmap(
        lambda body: st.dictionaries(st.text(max_size=10), json_values, max_size=2).map(
            lambda extra: {**extra, **body}))
TRANSLATED_ROUTES = {"/messages": messages_bodies, "/messages/count_tokens": messages_bodies,
                     "/responses": responses_bodies}


def _answered(route: str, response) -> bool:
    """Whether a 200 from ``route`` is the reply that API's clients expect; True for a proxied turn."""
    streamed = response.headers["content-type"].startswith("text/event-stream")
    if route == "/messages/count_tokens":
        assert isinstance(response.json()["input_tokens"], int)
        return False
    if route == "/messages":
        assert (response.text.startswith("event: message_start") and "event: message_stop" in response.text
                if streamed else response.json()["type"] == "message")
    else:
        assert (response.text.startswith("event: response.created") and (
            "event: response.completed" in response.text or "event: response.incomplete" in response.text)
                if streamed else response.json()["object"] == "response")
    return True


def test_random_messages_and_responses_bodies_get_a_reply_or_a_4xx_in_their_api_shape(gateway_factory, fake,
                                                                                      secret):
    gateway = gateway_factory([fake.url], max_body_bytes=MAX_BODY)
    seen: dict[str, int] = {}
    proxied = 0
    answered: dict[str, list[int]] = {}

    @seed(34)
    @settings(max_examples=EXAMPLES // 2, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
              print_blob=False)
    @given(data=st.data(), route=st.sampled_from(sorted(TRANSLATED_ROUTES)))
    def one(data, route):
        nonlocal proxied
        body = data.draw(TRANSLATED_ROUTES[route])
        response = httpx.post(f"{gateway.v1}{route}", json=body, headers={"x-api-key": secret}, timeout=15)
        seen[f"{route} {response.status_code}"] = seen.get(f"{route} {response.status_code}", 0) + 1
        answered.setdefault(response.headers["x-request-id"], []).append(response.status_code)
        assert response.status_code < 500, (route, body, response.text[:500])
        if response.status_code == 200:
            proxied += _answered(route, response)
        else:
            shaped = _is_openai_error if route == "/responses" else _is_anthropic_error
            assert 400 <= response.status_code < 500 and shaped(response), response.text[:500]

    one()
    gateway.spy.wait_for(proxied, timeout=30)
    time.sleep(1.0)
    print(f"\ntranslated APIs fuzz: statuses {dict(sorted(seen.items()))}, {proxied} proxied")
    _captured_as_answered(list(gateway.spy.records), proxied, answered)
    assert proxied > 0
