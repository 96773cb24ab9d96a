"""The gateway's chat contract on the default model (SmolLM2-135M-Instruct, the shared ``real_vllm_server``),
through the real openai SDK: a plain question answered and captured with the served token ids and
log-probs, streamed and not; a named tool call (vLLM's structured output) relayed whole, streamed and not,
and the tool's result sent back answered in text;
and, with a declared tool and ``tool_choice: "auto"``, no call to a tool the request did not declare.

A few short greedy requests (about 20 s on two busy cores) beside the real model's other tests.
"""

import openai
import pytest

from tests.factories import make_key
from tests.gateway.conftest import forget_tenant_adapters, gateway_factory  # noqa: F401
from tests.specs import NAMED_WEATHER, WEATHER_MSGS
from tests.specs import WEATHER_DESCRIBED as WEATHER

pytestmark = pytest.mark.timeout(600)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"model": "base", "temperature": 0, "max_tokens": 24}


@pytest.fixture
def client(real_vllm_server, gateway_factory):  # noqa: F811
    forget_tenant_adapters(real_vllm_server.base_url)
    gateway = gateway_factory([real_vllm_server.base_url], base_model=real_vllm_server.model)
    _, secret = make_key()
    return openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0, timeout=300), gateway.spy


def test_a_question_is_answered_and_captured_with_the_served_tokens(client, real_vllm_server):
    sdk, spy = client
    reply = sdk.chat.completions.create(messages=QUESTION, **GREEDY)
    assert "Paris" in reply.choices[0].message.content and reply.model == "base"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       sdk.chat.completions.create(messages=QUESTION, stream=True, **GREEDY) if c.choices)
    assert streamed == reply.choices[0].message.content  # greedy: the same answer either way
    for record in spy.wait_for(2):
        assert record.upstream_model == real_vllm_server.model and record.prompt_token_ids
        assert len(record.token_ids) == len(record.logprobs) == record.completion_tokens > 0


def test_a_named_tool_call_is_relayed_whole(client):
    sdk, spy = client
    common = {"model": "base", "messages": WEATHER_MSGS, "tools": [WEATHER], "tool_choice": NAMED_WEATHER,
              "temperature": 0, "max_tokens": 64}
    call = sdk.chat.completions.create(**common).choices[0].message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    chunks = list(sdk.chat.completions.create(**common, stream=True))
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    joined = spy.wait_for(2)[-1].choices[0]["message"]["tool_calls"][0]
    assert joined["function"] == {"name": "get_weather", "arguments": call.function.arguments}

    # The round's second half: the tool's result goes back and the model answers in text.
    result = [{"role": "assistant", "content": None, "tool_calls": [
                  {"id": call.id, "type": "function",
                   "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
              {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees Celsius."}]
    answer = sdk.chat.completions.create(**{**common, "messages": WEATHER_MSGS + result,
                                            "tool_choice": "none"})
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    record = spy.wait_for(3)[-1]
    assert record.request["messages"][-1]["role"] == "tool" and record.token_ids


@pytest.mark.parametrize("ask", ["What is 17 times 23? Use a calculator tool.",
                                 "Search the web for the weather in Paris and send me an email about it."])
def test_with_tool_choice_auto_no_undeclared_tool_is_called(client, ask):
    sdk, _ = client
    common = {"model": "base", "messages": [{"role": "user", "content": ask}], "tools": [WEATHER],
              "tool_choice": "auto", "temperature": 0, "max_tokens": 64}
    message = sdk.chat.completions.create(**common).choices[0].message
    assert {c.function.name for c in message.tool_calls or ()} <= {"get_weather"}
    chunks = list(sdk.chat.completions.create(**common, stream=True))
    assert {tc.function.name for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])
            if tc.function and tc.function.name} <= {"get_weather"}
