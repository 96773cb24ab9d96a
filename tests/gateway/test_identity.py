"""Session and turn identity from what OpenClaw really sends: the Runtime line's sessionId, side requests
recognised by their shape, and ClawHub's body fields of any JSON type coerced, never refused."""

import pytest

from clawhub.gateway.identity import extract_identity

SESSION = "3f2b8c1e-5d6a-4e7f-9a0b-1c2d3e4f5a6b"
RUNTIME = (f"Runtime: agent=main | session=agent:main:main | sessionId={SESSION} | host=ci | repo=/w | "
           "os=linux | node=v24.22.3 | model=clawhub/clawhub-personal")
SYSTEM = {"role": "system", "content": "You are OpenClaw. Heartbeats: reply HEARTBEAT_OK when idle."}


def openclaw_user(text: str) -> dict:
    return {"role": "user", "content": f"[Tue 2026-12-01 08:27 UTC] {text}\n\n{RUNTIME}"}


INTERNAL = {"role": "user", "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nnote"
                                                                   "\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]}


def test_the_runtime_line_gives_the_session_when_nothing_else_does():
    body = {"messages": [SYSTEM, openclaw_user("hello"), {"role": "assistant", "content": "hi"},
                         INTERNAL, {"role": "user", "content": "[Tue 2026-12-01 08:28 UTC] and now?"}]}
    identity = extract_identity({}, body)
    assert (identity.session_id, identity.turn_type) == (SESSION, None)  # main or not: capture decides
    assert RUNTIME in body["messages"][1]["content"]  # the model saw it; it stays in the prompt


def test_the_runtime_line_in_a_content_array_counts_too():
    body = {"messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "q"},
                                                              {"type": "text", "text": RUNTIME}]}]}
    assert extract_identity({}, body).session_id == SESSION


@pytest.mark.parametrize("where", ["header", "body", "marker"])
def test_an_explicit_session_wins_over_the_runtime_line(where):
    body = {"messages": [SYSTEM, openclaw_user("hello")]}
    headers = {}
    if where == "header":
        headers = {b"x-session-id": b"explicit"}
    elif where == "body":
        body["session_id"] = "explicit"
    else:
        body["messages"][0] = {"role": "system", "content": "S\n[RL-TRAINING-META] session_id=explicit"}
    assert extract_identity(headers, body).session_id == "explicit"


def test_a_runtime_word_that_is_not_the_line_is_ignored():
    body = {"messages": [{"role": "user", "content": "What does sessionId= mean in Runtime: logs?"}]}
    assert extract_identity({}, body).session_id is None
    body = {"messages": [{"role": "assistant", "content": RUNTIME}, {"role": "user", "content": "q"}]}
    assert extract_identity({}, body).session_id is None  # only user messages carry it


@pytest.mark.parametrize(("given", "expected"), [
    (7, "7"), (7.0, "7"), (1.5, "1.5"), ("  s-1 ", "s-1"), ("", None), (True, None), ([1], None),
    ({"id": 1}, None), (None, None), ("x" * 300, "x" * 200),
])
def test_session_id_of_any_json_type_is_coerced_and_removed(given, expected):
    body = {"session_id": given, "messages": [{"role": "user", "content": "q"}]}
    assert extract_identity({}, body).session_id == expected
    assert "session_id" not in body  # never forwarded: vLLM refuses a non-string session_id


@pytest.mark.parametrize(("given", "expected"), [
    ("main", "main"), ("SIDE", "side"), (" side ", "side"), ("other", None), (1, None), (None, None),
    (["main"], None),
])
def test_turn_type_of_any_json_type_is_coerced_or_inferred(given, expected):
    body = {"turn_type": given, "messages": [{"role": "user", "content": "q"}]}
    assert extract_identity({}, body).turn_type == expected
    assert "turn_type" not in body


@pytest.mark.parametrize(("given", "expected"), [
    (True, True), (False, False), (1, True), (0, False), (2.5, True), ("true", True), ("YES", True),
    ("1", True), ("0", False), ("nope", False), (None, False), ([], False), ({}, False),
])
def test_session_done_of_any_json_type_is_coerced(given, expected):
    body = {"session_done": given, "messages": [{"role": "user", "content": "q"}]}
    assert extract_identity({}, body).session_done is expected
    assert "session_done" not in body


def test_headers_are_coerced_the_same_way():
    headers = {b"x-session-id": b" h1 ", b"x-turn-type": b"Side", b"x-session-done": b"TRUE"}
    identity = extract_identity(headers, {"messages": [{"role": "user", "content": "q"}]})
    assert (identity.session_id, identity.turn_type, identity.session_done) == ("h1", "side", True)
    identity = extract_identity({b"x-turn-type": b"bogus", b"x-session-done": b"no"},
                                {"messages": [openclaw_user("q")]})
    assert (identity.session_id, identity.turn_type, identity.session_done) == (SESSION, None, False)


HEARTBEAT = ("Follow the heartbeat monitor scratch context when provided. Recurring tasks are automations; "
             "create or change their schedules with the automations tool, not heartbeat scratch. Do not "
             "infer or repeat old tasks from prior chats. If nothing needs attention, reply NO_REPLY.")
MEMORY_FLUSH = ("Pre-compaction memory flush. Store durable memories now (use memory/2026-12-01.md). "
                "If nothing to store, reply with NO_REPLY.")


@pytest.mark.parametrize(("messages", "kind"), [
    # OpenClaw 2026.9's heartbeat prompt, and the older one with its reply convention.
    ([SYSTEM, openclaw_user(HEARTBEAT)], "heartbeat"),
    ([SYSTEM, {"role": "user", "content": "Read HEARTBEAT.md if it exists. If idle reply HEARTBEAT_OK."}],
     "heartbeat"),
    ([SYSTEM, openclaw_user("hi"), {"role": "assistant", "content": "hello"}, {"role": "user",
                                                                                "content": MEMORY_FLUSH}],
     "memory_flush"),
    ([{"role": "system", "content": "Pre-compaction memory flush turn. The session is near compaction."},
      {"role": "user", "content": "go"}], "memory_flush"),
    ([{"role": "system", "content": "You are a context summarization assistant. Your task is to read a "
                                    "conversation"}, {"role": "user", "content": "summarise"}], "compaction"),
    ([{"role": "user", "content": [{"type": "text", "text": "<conversation>\n[User]: hi\n</conversation>\n\n"
                                                            "Summarize the conversation above."}]}],
     "compaction"),
])
def test_openclaw_side_requests_are_side_turns_by_their_shape(messages, kind):
    identity = extract_identity({}, {"messages": messages})
    assert (identity.turn_type, identity.side_kind) == ("side", kind)


def test_an_ordinary_openclaw_turn_is_not_a_side_turn_though_its_system_prompt_mentions_heartbeats():
    for messages in ([SYSTEM, openclaw_user("Fix the failing test")],
                     [SYSTEM, openclaw_user("hi"), {"role": "assistant", "content": "HEARTBEAT_OK"},
                      {"role": "user", "content": "Now write the README"}]):
        identity = extract_identity({}, {"messages": messages})
        assert (identity.turn_type, identity.side_kind) == (None, None)


def test_an_explicit_turn_type_wins_over_the_shape():
    body = {"turn_type": "main", "messages": [SYSTEM, openclaw_user(HEARTBEAT)]}
    identity = extract_identity({}, body)
    assert (identity.turn_type, identity.side_kind) == ("main", None)
