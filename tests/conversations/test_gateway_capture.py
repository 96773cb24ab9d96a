"""End to end: the openai SDK through the real gateway to the fake upstream, and what the gateway hands over
stored by capture_store. Checks the TurnRecord contract as the gateway really fills it (streamed and not,
tool calls, session headers), not as this folder's builders imagine it."""

import openai

from clawhub.conversations import hooks
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session, Turn
from clawhub.usage.models import UsageDaily
from tests.factories import make_key, make_user
from tests.gateway.conftest import fake, fake_upstream, gateway, gateway_factory  # noqa: F401

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def test_a_conversation_through_the_gateway_is_stored_as_one_session(gateway, monkeypatch):  # noqa: F811
    ready: list[int] = []
    monkeypatch.setattr(hooks, "on_turn_ready_for_judging", ready.extend)
    owner = make_user()
    key, secret = make_key(owner)
    client = openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)

    # Turn 1 calls a tool (not streamed); turn 2 sends the tool's result (streamed, like OpenClaw); turn 3 is
    # a heartbeat (side) in the same conversation; turn 4 the user's reply; turn 5 a session the client names.
    history = [{"role": "system", "content": "You are an agent."},
               {"role": "user", "content": "open notes.txt"}]
    first = client.chat.completions.create(model="clawhub-personal", messages=history, tools=TOOLS,
                                           tool_choice="required")
    call = first.choices[0].message
    assert call.tool_calls
    history += [call.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "buy milk"}]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="clawhub-personal", messages=history, stream=True, stream_options={"include_usage": True})
        if chunk.choices)
    history.append({"role": "assistant", "content": text})
    client.chat.completions.create(
        model="clawhub-personal", messages=[*history, {"role": "user", "content": "Read HEARTBEAT.md"}])
    client.chat.completions.create(model="clawhub-personal",
                                   messages=[*history, {"role": "user", "content": "thanks, that's right"}])
    client.chat.completions.create(model="clawhub-personal", messages=[{"role": "user", "content": "other"}],
                                   extra_headers={"X-Session-Id": "explicit-1", "X-Session-Done": "true"})

    records = gateway.spy.wait_for(5)
    capture_store(records)

    turns = list(Turn.objects.filter(user=owner).order_by("created_at"))
    assert [t.turn_type for t in turns] == ["main", "main", "side", "main", "main"]
    inferred = Session.objects.get(user=owner, inferred=True)
    assert {t.session_id for t in turns[:4]} == {inferred.pk}
    assert turns[0].next_state == [history[3]]  # the tool result answers the tool call
    assert turns[1].next_state == [{"role": "user", "content": "thanks, that's right"}]
    assert turns[1].token_ids and len(turns[1].token_ids) == len(turns[1].logprobs)  # asked of vLLM, kept
    explicit = Session.objects.get(external_id="explicit-1")
    assert explicit.close_reason == "done" and turns[4].closed_without_next
    assert sorted(ready) == sorted([turns[0].pk, turns[1].pk, turns[4].pk])

    row = UsageDaily.objects.get(key=key)
    assert row.requests == 5 and row.streams == 1
    assert row.prompt_tokens == sum(r.prompt_tokens for r in records)
    assert row.completion_tokens == sum(r.completion_tokens for r in records)
