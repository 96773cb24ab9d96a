"""Session inference hashes and the turn-type rule table, without a database."""

import re

import pytest

from clawhub.conversations.identity import (
    MAIN,
    SIDE,
    canonical_message,
    continuation_hash,
    continuation_hash_without_retry,
    next_state_messages,
    prefix_hashes,
    reply_message,
    turn_type_for,
)
from tests.conversations.conftest import assistant, system, tool, tool_call, user

HISTORY = [system(), user("What is 2+2?")]
REPLY = {"role": "assistant", "content": "4"}


def test_a_continuation_matches_the_newest_prefix():
    stored = continuation_hash(HISTORY, REPLY)
    follow_up = [*HISTORY, assistant("4"), user("And 3+3?")]
    assert prefix_hashes(follow_up)[0] == stored


@pytest.mark.parametrize(
    "resent",
    [
        # content as text parts instead of a string
        [
            system(),
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "4"}]},
        ],
        # whitespace at the ends, and fields the client adds as null or drops
        [
            {"role": "system", "content": "You are a helpful agent.\n", "name": None},
            {"role": "user", "content": "  What is 2+2?"},
            {
                "role": "assistant",
                "content": "4 ",
                "tool_calls": None,
                "refusal": None,
                "reasoning_content": "hmm",
            },
        ],
        # tool_calls as an empty list
        [*HISTORY, {"role": "assistant", "content": "4", "tool_calls": []}],
    ],
)
def test_harmless_differences_in_resent_history_still_match(resent):
    assert prefix_hashes([*resent, user("next")])[0] == continuation_hash(HISTORY, REPLY)


def test_real_differences_do_not_match():
    stored = continuation_hash(HISTORY, REPLY)
    assert prefix_hashes([*HISTORY, assistant("5"), user("next")])[0] != stored
    assert prefix_hashes([system(), user("What is 2+3?"), assistant("4"), user("next")])[0] != stored
    assert prefix_hashes([system("Other prompt."), user("What is 2+2?"), assistant("4")])[0] != stored


INTERNAL = {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nAGENTS.md\n"
            "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}
RETRY = user("The previous attempt did not produce a user-visible answer. Produce the visible answer now.")


def test_after_a_served_retry_the_history_without_the_instruction_continues_it():
    """OpenClaw's retry: the history, the user's message, its instruction to answer. Served, the next request
    resends the message and the reply but not the instruction: its prefix matches the retry's second hash,
    and only that one (its own continuation hash keeps the instruction)."""
    asked = [*HISTORY, assistant("4"), user("And 3+3?")]
    retry = [*asked, INTERNAL, RETRY]
    next_request = [*asked, assistant("6"), user("thanks"), INTERNAL]
    six = {"role": "assistant", "content": "6"}
    assert prefix_hashes(next_request)[0] == continuation_hash_without_retry(retry, six)
    assert prefix_hashes(next_request)[0] != continuation_hash(retry, six)
    second = continuation_hash_without_retry(retry, six)
    assert second == continuation_hash(asked, six)
    # Each retry message after the first is dropped, however many there are.
    assert continuation_hash_without_retry([*asked, RETRY, user("please")], six) == second
    # A different reply, or a different message before the instruction, is another conversation.
    assert prefix_hashes([*asked, assistant("7"), user("thanks")])[0] != second
    other = [*HISTORY, assistant("4"), user("And 3+4?"), RETRY]
    assert continuation_hash_without_retry(other, six) != continuation_hash_without_retry(retry, six)


@pytest.mark.parametrize(
    "messages",
    [
        [*HISTORY],  # one trailing user message: nothing to drop
        [*HISTORY, INTERNAL],  # internal context is not a message of the user's
        [system(), INTERNAL, user("What is 2+2?")],
        [*HISTORY, assistant("4"), tool("result")],  # a tool result is not a user message
    ],
)
def test_no_second_continuation_hash_without_trailing_retry_messages(messages):
    assert continuation_hash_without_retry(messages, REPLY) == ""


def test_no_second_continuation_hash_without_a_reply():
    assert continuation_hash_without_retry([*HISTORY, RETRY], None) == ""
    assert continuation_hash_without_retry([*HISTORY, RETRY], REPLY) != ""


def test_tool_call_arguments_and_ids_are_canonical():
    call = tool_call("read", '{"path": "a.txt", "limit": 10}', call_id="call_1")
    stored = continuation_hash(
        [user("read a.txt")], {"role": "assistant", "content": None, "tool_calls": [call]}
    )
    resent = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_other",
                "type": "function",
                "function": {"name": "read", "arguments": '{"limit":10,"path":"a.txt"}'},
            },
        ],
    }
    assert prefix_hashes([user("read a.txt"), resent, tool("contents", "call_other")])[0] == stored
    changed = {**resent, "tool_calls": [{"function": {"name": "read", "arguments": '{"path": "b.txt"}'}}]}
    assert prefix_hashes([user("read a.txt"), changed])[0] != stored


def test_prefix_hashes_are_newest_first_and_only_after_assistant_messages():
    messages = [system(), user("a"), assistant("A"), user("b"), assistant("B"), user("c")]
    hashes = prefix_hashes(messages)
    assert len(hashes) == 2
    assert hashes[0] == continuation_hash(messages[:4], messages[4])
    assert hashes[1] == continuation_hash(messages[:2], messages[2])
    assert prefix_hashes([system(), user("a")]) == []


def test_reply_message_reads_every_recorded_choice_shape():
    assert reply_message([{"message": {"role": "assistant", "content": "hi"}}])["content"] == "hi"
    assert reply_message([{"delta": {"content": "hi"}}])["content"] == "hi"
    assert reply_message([{"content": None, "tool_calls": [tool_call("x")]}])["tool_calls"]
    assert reply_message([]) is None
    assert reply_message([{"message": {"content": None}}]) is None


def test_canonical_message_keeps_images():
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    message = canonical_message({"role": "user", "content": [{"type": "text", "text": " look "}, image]})
    assert message["content"] == [{"type": "text", "text": "look"}, image]


def test_next_state_is_what_follows_the_last_assistant_message():
    assert next_state_messages([user("a"), assistant("A"), user("b")]) == [user("b")]
    results = [tool("r1", "c1"), tool("r2", "c2")]
    calls = assistant(None, [tool_call("x", call_id="c1"), tool_call("y", call_id="c2")])
    assert next_state_messages([user("a"), calls, *results]) == results
    assert next_state_messages([user("a"), calls, *results, user("thanks")]) == [*results, user("thanks")]
    # A client that does not resend history: the newest user message.
    assert next_state_messages([system(), user("only")]) == [user("only")]


@pytest.mark.parametrize(
    ("explicit", "route", "text", "expected"),
    [
        ("side", "chat", "a real question", SIDE),
        (
            "main",
            "chat",
            "Read HEARTBEAT.md if it exists. If nothing needs attention, reply HEARTBEAT_OK.",
            MAIN,
        ),
        (None, "chat", "a real question", MAIN),
        (None, "chat", "Read HEARTBEAT.md if it exists (workspace context). Follow it strictly.", SIDE),
        (None, "chat", "Check the inbox. If nothing needs attention, reply HEARTBEAT_OK.", SIDE),
        (None, "chat", "Pre-compaction memory flush. Store durable memories now.", SIDE),
        (None, "chat", "my heartbeat monitor is broken, help", MAIN),
        (None, "completions", "anything", SIDE),
        ("bogus", "chat", "a real question", MAIN),
    ],
)
def test_turn_type_rules(explicit, route, text, expected):
    messages = [system("Reply HEARTBEAT_OK to heartbeat polls."), user(text)]
    assert turn_type_for(explicit=explicit, route=route, messages=messages) == expected


def test_turn_type_reads_the_newest_user_message_only():
    heartbeat_then_real = [user("Read HEARTBEAT.md"), assistant("HEARTBEAT_OK"), user("now a real task")]
    assert turn_type_for(explicit=None, route="chat", messages=heartbeat_then_real) == MAIN
    # The tool loop of a heartbeat run is still the heartbeat run.
    loop = [user("Read HEARTBEAT.md"), assistant(None, [tool_call("ls")]), tool("files")]
    assert turn_type_for(explicit=None, route="chat", messages=loop) == SIDE


def test_configured_side_patterns():
    patterns = [re.compile(r"^\[cron\]")]
    assert (
        turn_type_for(explicit=None, route="chat", messages=[user("[cron] nightly")], side_patterns=patterns)
        == SIDE
    )
    assert (
        turn_type_for(explicit=None, route="chat", messages=[user("nightly [cron]")], side_patterns=patterns)
        == MAIN
    )


def test_capture_encodes_each_message_of_a_record_once(monkeypatch):
    """Capture takes five hashes of a record's history (prefixes, prompt, retries, both continuations) in
    one pass: each message canonicalised and encoded once, not once per hash (0.66 ms vs 0.24 ms on a 92 KB
    body)."""
    from clawhub.conversations import identity
    from clawhub.conversations.capture.items import item_of
    from clawhub.conversations.capture.records import TurnRecord

    encoded = []
    real = identity._encoded
    monkeypatch.setattr(identity, "_encoded", lambda message: encoded.append(message) or real(message))
    messages = [system(), user("a"), assistant("b"), user("c"), user("c, again"), user("and again")]
    record = TurnRecord(request_id="r", route="chat", key_id=1, user_id=1, tenant_id=1, group_id=None,
                        model="m", upstream_model="m", adapter_version_id=None, upstream="u",
                        status="complete", http_status=200, started_at=1.0, latency_ms=1.0,
                        request={"messages": messages},
                        choices=[{"index": 0, "message": {"role": "assistant", "content": "d"}}])
    item = item_of(record)
    assert len(encoded) == len(messages) + 1  # and the reply
    assert item.candidates and item.prompt_hash and item.continuation and len(item.retry_hashes) == 2
    assert item.continuation_without_retry not in ("", item.continuation)


def test_a_resent_history_is_canonicalised_once(monkeypatch):
    """A conversation resends its history with every request: a message canonicalised for one request is
    not canonicalised again for the next, and the hashes are those of a fresh computation."""
    from clawhub.conversations import identity

    monkeypatch.setattr(identity, "_ENCODINGS", {})
    canonicalised = []
    real = identity._canonical_encoding
    monkeypatch.setattr(identity, "_canonical_encoding",
                        lambda message: canonicalised.append(message) or real(message))
    first = [system(), user("What is 2+2?")]
    identity.message_hashes(first, REPLY)
    assert len(canonicalised) == 3
    canonicalised.clear()
    resent = [system(), user("What is 2+2?"), dict(REPLY), user("And 3+3?")]
    remembered = identity.message_hashes(resent, REPLY)
    assert canonicalised == [resent[-1]]  # only the new message
    monkeypatch.setattr(identity, "_ENCODINGS", {})
    assert identity.message_hashes(resent, REPLY) == remembered
    assert remembered.candidates[0][0] == continuation_hash(first, REPLY)
