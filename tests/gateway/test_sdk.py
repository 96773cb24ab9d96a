"""The gateway in front of the fake upstream, driven by the real openai SDK over HTTP."""

import asyncio

import httpx
import openai
import pytest

from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_key, make_user
from tests.gateway.conftest import activate_adapter, user_with_adapter

MSGS = [{"role": "user", "content": "hi there"}]


def client(gateway, secret) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)


@pytest.fixture
def alice():
    return user_with_adapter()


def test_sync_chat_uses_the_tenants_active_adapter_and_rewrites_model(gateway, fake, alice):
    user, key, secret, version = alice
    resp = client(gateway, secret).chat.completions.create(model="clawhub-personal", messages=MSGS)
    assert resp.model == "clawhub-personal"
    # The fake names the model it was asked for: the tenant's adapter, loaded on demand.
    assert resp.choices[0].message.content.startswith(f"t{user.tenant.pk}-v1 says hello")
    assert fake.stats()["adapters"] == {f"t{user.tenant.pk}-v1": version.artifact_path}
    assert resp.usage.completion_tokens == 8
    # Token ids and logprobs were asked of vLLM for training but the client did not ask: stripped.
    assert resp.choices[0].logprobs is None
    assert "token_ids" not in (resp.choices[0].model_extra or {})
    assert "prompt_token_ids" not in (resp.model_extra or {})
    sent = fake.stats()["last_request"]
    assert sent["logprobs"] is True and sent["return_token_ids"] is True and "stream_options" not in sent

    record = gateway.spy.last()
    assert record.status == "complete" and record.http_status == 200
    assert (record.key_id, record.user_id, record.tenant_id) == (key.pk, user.pk, user.tenant.pk)
    assert record.model == "clawhub-personal" and record.upstream_model == f"t{user.tenant.pk}-v1"
    assert record.adapter_version_id == version.pk and record.upstream == fake.url
    assert len(record.token_ids) == 8 and len(record.logprobs) == 8
    assert record.prompt_tokens == resp.usage.prompt_tokens and record.completion_tokens == 8
    assert record.request["messages"] == MSGS and record.request["model"] == "clawhub-personal"


def test_two_users_get_different_adapters_and_a_group_key_the_group_adapter(gateway, fake):
    bob, carol = make_user(), make_user()
    _, bob_secret = make_key(bob)
    _, carol_secret = make_key(carol)
    activate_adapter(bob.tenant, version=3)
    activate_adapter(carol.tenant, version=1)
    group = make_group(owner=carol)
    member = add_member(group, role=Role.MEMBER)
    _, group_secret = make_key(member, group=group)
    activate_adapter(group.tenant, version=2)

    bob_text = client(gateway, bob_secret).chat.completions.create(
        model="clawhub-personal", messages=MSGS).choices[0].message.content
    carol_text = client(gateway, carol_secret).chat.completions.create(
        model="clawhub-personal", messages=MSGS).choices[0].message.content
    group_resp = client(gateway, group_secret).chat.completions.create(
        model=f"clawhub-group-{group.slug}", messages=MSGS)
    assert bob_text.startswith(f"t{bob.tenant.pk}-v3 ")
    assert carol_text.startswith(f"t{carol.tenant.pk}-v1 ")
    assert group_resp.choices[0].message.content.startswith(f"t{group.tenant.pk}-v2 ")
    assert group_resp.model == f"clawhub-group-{group.slug}"
    record = gateway.spy.wait_for(3)[-1]
    assert record.group_id == group.pk and record.tenant_id == group.tenant.pk


def test_without_an_adapter_the_base_model_answers(gateway, fake):
    _, secret = make_key()
    resp = client(gateway, secret).chat.completions.create(model="clawhub-personal", messages=MSGS)
    assert resp.choices[0].message.content.startswith("tiny says hello")
    resp = client(gateway, secret).chat.completions.create(model="base", messages=MSGS)
    assert resp.model == "base" and resp.choices[0].message.content.startswith("tiny ")
    assert gateway.spy.wait_for(2)[-1].adapter_version_id is None


def test_models_lists_only_what_the_key_may_use(gateway):
    owner = make_user()
    _, personal = make_key(owner)
    _, base_only = make_key(owner, allowed_models=["base"])
    group = make_group(owner=owner)
    _, group_secret = make_key(owner, group=group)
    assert [m.id for m in client(gateway, personal).models.list()] == ["clawhub-personal", "base"]
    assert [m.id for m in client(gateway, base_only).models.list()] == ["base"]
    group_models = [m.id for m in client(gateway, group_secret).models.list()]
    assert group_models == [f"clawhub-group-{group.slug}", "base"]
    assert client(gateway, personal).models.retrieve("base").id == "base"


def test_async_streaming_rewrites_every_chunk_and_strips_usage_and_training_fields(gateway, fake, alice):
    user, _, secret, _ = alice

    async def run():
        async with openai.AsyncOpenAI(base_url=gateway.v1, api_key=secret, max_retries=0) as ac:
            stream = await ac.chat.completions.create(model="clawhub-personal", messages=MSGS, stream=True)
            return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    assert chunks and all(c.model == "clawhub-personal" for c in chunks)
    assert all(c.choices for c in chunks), "the usage-only chunk must be stripped when not asked for"
    assert all(c.usage is None for c in chunks)
    assert all(ch.logprobs is None and "token_ids" not in (ch.model_extra or {})
               for c in chunks for ch in c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.startswith(f"t{user.tenant.pk}-v1 says hello")
    sent = fake.stats()["last_request"]
    assert sent["stream_options"] == {"include_usage": True}

    record = gateway.spy.last()
    assert record.stream and record.status == "complete" and record.ttft_ms is not None
    assert record.choices[0]["message"]["content"] == text
    assert record.choices[0]["finish_reason"] == "stop"
    assert len(record.token_ids) == 8 and len(record.logprobs) == 8
    assert record.completion_tokens == 8 and not record.usage_estimated


def test_stream_keeps_the_usage_chunk_when_asked(gateway, alice):
    _, _, secret, _ = alice
    stream = client(gateway, secret).chat.completions.create(
        model="clawhub-personal", messages=MSGS, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].model == "clawhub-personal"


def test_raw_sse_ends_with_done_and_model_rewritten(gateway, alice):
    _, _, secret, _ = alice
    with httpx.stream("POST", f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": "clawhub-personal", "messages": MSGS, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all('"model":"clawhub-personal"' in line for line in lines[:-1])
    assert not any("t" + "1-v" in line and '"model":"t' in line for line in lines)


def test_tool_calls_non_streaming_and_streaming(gateway, alice):
    _, _, secret, _ = alice
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    api = client(gateway, secret)
    resp = api.chat.completions.create(model="clawhub-personal", messages=MSGS, tools=tools,
                                       tool_choice="required")
    call = resp.choices[0].message.tool_calls[0]
    assert resp.choices[0].finish_reason == "tool_calls" and call.function.name == "search"

    named = {"type": "function", "function": {"name": "search"}}
    chunks = list(api.chat.completions.create(model="clawhub-personal", messages=MSGS, tools=tools,
                                              tool_choice=named, stream=True))
    args = "".join(tc.function.arguments or "" for c in chunks for ch in c.choices
                   for tc in (ch.delta.tool_calls or []))
    assert args.startswith('{"query": ')
    record = gateway.spy.wait_for(2)[-1]
    joined = record.choices[0]["message"]["tool_calls"][0]
    assert joined["function"] == {"name": "search", "arguments": args} and joined["id"] == "chatcmpl-tool-0"
    # vLLM ends a call to a named function with "stop" ("tool_calls" is for tool_choice="required").
    assert record.choices[0]["finish_reason"] == "stop"
    assert record.request["tools"] == tools


def test_n_and_logprobs_pass_through_when_asked(gateway, fake, alice):
    _, _, secret, _ = alice
    resp = client(gateway, secret).chat.completions.create(
        model="clawhub-personal", messages=MSGS, n=2, logprobs=True, top_logprobs=2, max_tokens=5,
        extra_body={"return_token_ids": True})
    assert len(resp.choices) == 2
    assert len(resp.choices[1].logprobs.content) == 5
    assert len(resp.choices[0].logprobs.content[0].top_logprobs) == 2
    assert len(resp.choices[0].model_extra["token_ids"]) == 5
    assert fake.stats()["last_request"]["top_logprobs"] == 2


def test_unknown_fields_pass_through_and_identity_fields_do_not(gateway, fake, alice):
    _, _, secret, _ = alice
    system = "You are helpful.\n[RL-TRAINING-META] session_id=sess-9 turn_type=side"
    client(gateway, secret).chat.completions.create(
        model="clawhub-personal", messages=[{"role": "system", "content": system}, *MSGS],
        response_format={"type": "json_object"}, max_completion_tokens=4, stop=["x"],
        extra_body={"session_id": "sess-1", "turn_type": "main", "session_done": True, "top_k": 5,
                    "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"})
    sent = fake.stats()["last_request"]
    for field in ("session_id", "turn_type", "session_done"):
        assert field not in sent
    assert sent["top_k"] == 5 and sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent["response_format"] == {"type": "json_object"} and sent["max_completion_tokens"] == 4
    assert sent["stop"] == ["x"] and sent["reasoning_effort"] == "low"
    assert sent["messages"][0]["content"] == "You are helpful."
    record = gateway.spy.last()
    # Body fields win over the marker; headers would win over both.
    assert (record.session_id, record.turn_type, record.session_done) == ("sess-1", "main", True)


def test_marker_and_headers_set_identity_and_side_turns_are_not_asked_for_logprobs(gateway, fake, alice):
    _, _, secret, _ = alice
    system = "Be brief.\n[RL-TRAINING-META] session_id=sess-7 turn_type=side"
    client(gateway, secret).chat.completions.create(
        model="clawhub-personal", messages=[{"role": "system", "content": system}, *MSGS])
    record = gateway.spy.last()
    assert (record.session_id, record.turn_type) == ("sess-7", "side")
    sent = fake.stats()["last_request"]
    assert sent["messages"][0]["content"] == "Be brief." and "logprobs" not in sent

    client(gateway, secret).chat.completions.create(
        model="clawhub-personal", messages=[{"role": "system", "content": system}, *MSGS],
        extra_headers={"X-Session-Id": "from-header", "X-Turn-Type": "main", "X-Session-Done": "1"})
    record = gateway.spy.wait_for(2)[-1]
    assert (record.session_id, record.turn_type, record.session_done) == ("from-header", "main", True)


def test_completions_route(gateway, fake, alice):
    user, _, secret, _ = alice
    resp = client(gateway, secret).completions.create(model="clawhub-personal", prompt="Once upon",
                                                      max_tokens=4)
    assert resp.model == "clawhub-personal" and resp.choices[0].text.startswith(f"t{user.tenant.pk}-v1")
    chunks = list(client(gateway, secret).completions.create(model="base", prompt="x", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices).startswith("tiny says")
    record = gateway.spy.wait_for(2)[-1]
    assert record.route == "completions" and record.status == "complete" and record.completion_tokens == 8


def test_the_writer_hands_turns_to_the_real_capture_store(gateway_factory, fake, alice):
    from clawhub.conversations.models import Turn
    from clawhub.keys.models import ApiKey
    from tests.gateway.conftest import wait_until

    user, key, secret, version = alice
    gateway = gateway_factory([fake.url], real_capture=True)
    client(gateway, secret).chat.completions.create(
        model="clawhub-personal", messages=MSGS, extra_headers={"X-Session-Id": "s-real"})
    turn = wait_until(lambda: Turn.objects.filter(user=user).first())
    assert turn.session.external_id == "s-real" and turn.adapter_version_id == version.pk
    assert turn.status == "complete" and len(turn.token_ids) == 8
    # last_used_at is written by the writer thread, never on the hot path.
    assert wait_until(lambda: ApiKey.objects.get(pk=key.pk).last_used_at)
