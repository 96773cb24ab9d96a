"""POST /v1/messages and /v1/messages/count_tokens in front of the fake upstream, driven by the official
anthropic SDK over HTTP as Claude Code drives it: served through the chat route, captured and linked."""

import anthropic
import httpx
import openai
import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from tests.factories import make_key, make_user
from tests.gateway.conftest import inside_one_minute, user_with_adapter

SEARCH = {"name": "search", "description": "Search the notes",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}


def client(gateway, secret: str, *, bearer: bool = False) -> anthropic.Anthropic:
    # Claude Code sends ANTHROPIC_API_KEY as x-api-key and ANTHROPIC_AUTH_TOKEN as a Bearer token.
    auth = {"auth_token": secret} if bearer else {"api_key": secret}
    return anthropic.Anthropic(base_url=gateway.url, max_retries=0, **auth)


@pytest.fixture
def bob():
    return user_with_adapter()


def test_a_turn_is_served_by_the_tenants_adapter_through_chat_and_captured_with_token_ids(gateway, fake, bob):
    user, key, secret, version = bob
    reply = client(gateway, secret).messages.create(
        model="clawhub-personal", max_tokens=8, system="Be brief.",
        messages=[{"role": "user", "content": "hi there"}],
        extra_headers={"X-Claude-Code-Session-Id": "cc-session-1"})
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "clawhub-personal"
    assert reply.content[0].type == "text" and reply.content[0].text.startswith(f"t{user.tenant.pk}-v1 says")
    assert reply.stop_reason == "end_turn" and reply.id.startswith("msg_")
    sent = fake.stats()["last_request"]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hi there"}]
    assert sent["model"] == f"t{user.tenant.pk}-v1" and sent["return_token_ids"] is True and sent["logprobs"]

    record = gateway.spy.last()
    assert record.route == "chat" and record.status == "complete" and record.key_id == key.pk
    assert record.adapter_version_id == version.pk and record.session_id == "cc-session-1"
    assert len(record.token_ids) == 8 and len(record.logprobs) == 8 and record.prompt_token_ids
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (record.prompt_tokens, 8)
    assert record.request["messages"] == sent["messages"]
    assert reply.id == f"msg_{record.request_id}"


def test_a_stream_is_anthropic_events_chunk_by_chunk_with_usage(gateway, fake, bob):
    user, _, secret, _ = bob
    with client(gateway, secret, bearer=True).messages.stream(
            model="clawhub-personal", max_tokens=8,
            messages=[{"role": "user", "content": "hi there"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == 1 and "message_delta" in kinds
    assert final.content[0].text.startswith(f"t{user.tenant.pk}-v1 says") and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 8
    record = gateway.spy.last()
    assert record.stream and record.status == "complete" and len(record.token_ids) == 8
    assert record.choices[0]["message"]["content"] == final.content[0].text


def test_a_tool_round_is_captured_and_the_next_request_links_to_the_turn(gateway, fake, bob):
    user, _, secret, _ = bob
    anthropic_client = client(gateway, secret)
    history = [{"role": "user", "content": "find my notes on vLLM"}]
    first = anthropic_client.messages.create(model="clawhub-personal", max_tokens=8, tools=[SEARCH],
                                             tool_choice={"type": "any"}, messages=history)
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "search"
    assert call.input == {"query": f"t{user.tenant.pk}-v1"}
    # The client runs the tool and sends the history back, its reply as it got it.
    history += [{"role": "assistant",
                 "content": [block.model_dump(exclude_none=True) for block in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                              "content": "vLLM serves LoRA adapters."}]}]
    second = anthropic_client.messages.create(model="clawhub-personal", max_tokens=8, tools=[SEARCH],
                                              messages=history)
    assert second.stop_reason == "end_turn"
    assert fake.stats()["last_request"]["messages"][-1] == {
        "role": "tool", "tool_call_id": call.id, "content": "vLLM serves LoRA adapters."}

    capture_store(gateway.spy.wait_for(2))
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    assert len(turns) == 2 and turns[0].session_id == turns[1].session_id
    assert [(t.route, t.api) for t in turns] == [("chat", "messages")] * 2
    assert turns[1].parent_id == turns[0].pk and turns[1].link == "next"
    assert turns[0].next_state == [{"role": "tool", "tool_call_id": call.id,
                                    "content": "vLLM serves LoRA adapters."}]
    assert all(t.token_ids and t.prompt_token_count for t in turns)


def test_a_call_to_an_undeclared_tool_never_reaches_the_client(gateway, fake, bob):
    _, _, secret, _ = bob
    # The fake calls the first offered tool; the gateway's chat path sees "search" declared. A tool_choice
    # naming an undeclared tool makes the upstream call it, which must come back as text.
    reply = client(gateway, secret).messages.create(
        model="clawhub-personal", max_tokens=8, tools=[SEARCH], tool_choice={"type": "tool", "name": "rm_rf"},
        messages=[{"role": "user", "content": "clean up"}])
    assert [block.type for block in reply.content] == ["text"] and "rm_rf" in reply.content[0].text
    assert reply.stop_reason == "end_turn"


def test_errors_are_anthropic_shaped_and_raised_as_the_sdks_errors(gateway, fake, bob):
    _, _, secret, _ = bob
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(gateway, "chk_wrong").messages.create(model="clawhub-personal", max_tokens=8,
                                                     messages=[{"role": "user", "content": "x"}])
    assert caught.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": "Invalid, revoked or expired API key."}}
    with pytest.raises(anthropic.NotFoundError):
        client(gateway, secret).messages.create(model="claude-opus-9", max_tokens=8,
                                                messages=[{"role": "user", "content": "x"}])
    refused = httpx.post(f"{gateway.v1}/messages", headers={"x-api-key": secret},
                         json={"model": "clawhub-personal", "messages": [{"role": "user", "content": "x"}]})
    assert refused.status_code == 400
    assert refused.json()["error"] == {"type": "invalid_request_error",
                                       "message": "'max_tokens' is required (a positive integer)."}
    assert httpx.post(f"{gateway.v1}/messages", headers={"x-api-key": secret}, content=b"{").json()["type"] \
        == "error"


def test_count_tokens_renders_through_the_upstreams_tokenizer(gateway, fake, bob):
    _, _, secret, _ = bob
    counted = client(gateway, secret).messages.count_tokens(
        model="clawhub-personal", system="Be brief.", tools=[SEARCH],
        messages=[{"role": "user", "content": "hi there friend"}])
    assert counted.input_tokens == 5  # the fake counts words: "Be brief." + "hi there friend"
    sent = fake.stats()["last_request"]
    assert sent["model"] == "tiny" and sent["tools"][0]["function"]["name"] == "search"
    with pytest.raises(anthropic.NotFoundError):
        client(gateway, secret).messages.count_tokens(model="claude-opus-9",
                                                      messages=[{"role": "user", "content": "x"}])


def test_one_keys_quota_and_output_clamp_hold_across_the_three_apis(gateway, fake):
    _, limited = make_key(make_user(), rpm_limit=2)
    inside_one_minute()
    openai_client = openai.OpenAI(base_url=gateway.v1, api_key=limited, max_retries=0)
    openai_client.chat.completions.create(model="clawhub-personal",
                                          messages=[{"role": "user", "content": "x"}])
    # Claude Code asks for far more output than the served context holds: clamped as on the chat route.
    with client(gateway, limited).messages.stream(model="clawhub-personal", max_tokens=32000,
                                                  messages=[{"role": "user", "content": "x"}]) as stream:
        reply = stream.get_final_message()
    assert fake.stats()["last_request"]["max_tokens"] <= 2048  # the fake's max_model_len
    assert gateway.spy.wait_for(2)[-1].clamped_max_tokens <= 2048 and reply.usage.output_tokens <= 2048
    # The key's third request in the minute is refused, whichever API it comes through, in that API's shape.
    with pytest.raises(anthropic.RateLimitError) as refused:
        client(gateway, limited).messages.create(model="clawhub-personal", max_tokens=8,
                                                 messages=[{"role": "user", "content": "x"}])
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    with pytest.raises(openai.RateLimitError):
        openai_client.responses.create(model="clawhub-personal", input="x", store=False)


def test_count_tokens_takes_a_request_from_the_keys_rate_and_gives_its_slot_back(gateway, fake):
    # Rendering a long prompt costs the upstream CPU: a key cannot ask for it without limit.
    _, limited = make_key(make_user(), rpm_limit=3, concurrency_limit=1)
    inside_one_minute()
    anthropic_client = client(gateway, limited)
    body = {"model": "clawhub-personal", "messages": [{"role": "user", "content": "hi there"}]}
    # One at a time, each frees its concurrency slot: the next one is admitted.
    assert [anthropic_client.messages.count_tokens(**body).input_tokens for _ in range(3)] == [2, 2, 2]
    with pytest.raises(anthropic.RateLimitError) as refused:
        anthropic_client.messages.count_tokens(**body)
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60


def test_claude_codes_session_title_request_is_a_side_turn_beside_the_main_one(gateway, fake, bob):
    user, _, secret, _ = bob
    anthropic_client = client(gateway, secret)
    session = {"X-Claude-Code-Session-Id": "cc-titled"}
    # As Claude Code 2.1.332 sends it before the user's message is answered (recorded, texts cut).
    anthropic_client.messages.create(
        model="clawhub-personal", max_tokens=64, extra_headers=session,
        system=[{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
                {"type": "text", "text": "You are naming a coding session so the user can pick it out..."}],
        messages=[{"role": "user", "content": "<session>\nfind my notes\n</session>\n\nWrite the title..."}])
    assert "logprobs" not in fake.stats()["last_request"]  # served as side traffic: no training fields
    anthropic_client.messages.create(model="clawhub-personal", max_tokens=8, extra_headers=session,
                                     messages=[{"role": "user", "content": "find my notes"}])
    assert fake.stats()["last_request"]["logprobs"]

    capture_store(gateway.spy.wait_for(2))
    title, turn = Turn.objects.filter(user=user).order_by("created_at")
    assert (title.turn_type, turn.turn_type) == ("side", "main") and title.session_id == turn.session_id
    assert title.api == "messages" and turn.link == "" and turn.parent_id is None
