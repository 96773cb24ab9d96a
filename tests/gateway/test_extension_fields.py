"""vLLM's own request fields: the allowed ones reach the upstream within their bounds, the rest (grammars,
priority, engine internals) are refused with an OpenAI-shaped 400 naming the field, and every OpenAI field
still goes through untouched."""

import httpx

from clawhub.gateway.fields import ALLOWED, N_MAX, REFUSED

MSGS = [{"role": "user", "content": "hi"}]


def post(gateway, secret, path="/chat/completions", **fields):
    body = {"model": "clawhub-personal", **({"messages": MSGS} if path == "/chat/completions" else
                                             {"prompt": "hi"}), **fields}
    return httpx.post(f"{gateway.v1}{path}", json=body, headers={"Authorization": f"Bearer {secret}"},
                      timeout=30)


def refused(response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    return error["message"]


REFUSED_EXAMPLES = {
    "structured_outputs": {"regex": "(a+)+$"},
    "guided_regex": "(a+)+$",
    "guided_grammar": "root ::= 'a'*",
    "guided_json": {"type": "object"},
    "priority": -100,
    "request_id": "someone-elses",
    "kv_transfer_params": {"do_remote_prefill": True},
    "vllm_xargs": {"x": 1},
    "prompt_embeds": "AAAA",
    "use_beam_search": True,
    "chat_template": "{{ 7 * 7 }}",
    "mm_processor_kwargs": {"x": 1},
}


def test_engine_options_are_refused_with_an_openai_400(gateway, fake, secret):
    for path in ("/chat/completions", "/completions"):
        for field, value in REFUSED_EXAMPLES.items():
            assert field in REFUSED
            assert field in refused(post(gateway, secret, path, **{field: value}), field)
    assert fake.stats()["last_request"] is None  # none of them reached the upstream


def test_n_is_bounded(gateway, secret):
    for value in (1, N_MAX):
        response = post(gateway, secret, n=value, max_tokens=2)
        assert response.status_code == 200 and len(response.json()["choices"]) == value
    for value in (N_MAX + 1, 1000, 0, -1):
        assert f"1 to {N_MAX}" in refused(post(gateway, secret, n=value, max_tokens=2), "n")


OUT_OF_BOUNDS = [
    ("stop_token_ids", list(range(1000))), ("allowed_token_ids", list(range(300))),
    ("bad_words", ["x"] * 300), ("chat_template_kwargs", {f"k{i}": i for i in range(40)}),
    ("cache_salt", "s" * 1000), ("top_k", "5"), ("ignore_eos", "yes"), ("chat_template_kwargs", "x"),
]


def test_allowed_engine_options_out_of_bounds_are_refused(gateway, secret):
    for field, value in OUT_OF_BOUNDS:
        assert field in ALLOWED
        refused(post(gateway, secret, **{field: value}), field)


def test_allowed_engine_options_and_every_openai_field_reach_the_upstream(gateway, fake, secret):
    allowed = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1, "ignore_eos": False,
               "skip_special_tokens": True, "include_stop_str_in_output": False, "stop_token_ids": [7],
               "chat_template_kwargs": {"enable_thinking": False}, "cache_salt": "tenant-salt",
               "include_reasoning": True, "add_generation_prompt": True}
    openai = {"temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["\n\n"], "max_tokens": 8,
              "max_completion_tokens": 8, "user": "u-1", "metadata": {"a": "b"}, "parallel_tool_calls": False,
              "frequency_penalty": 0.1, "presence_penalty": 0.1, "logit_bias": {"5": 1},
              "response_format": {"type": "json_object"}, "reasoning_effort": "low",
              "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
              "tool_choice": "none", "logprobs": True, "top_logprobs": 2, "n": 2,
              "some_field_nobody_knows": 1}
    response = post(gateway, secret, stream=True, stream_options={"include_usage": True}, **allowed, **openai)
    assert response.status_code == 200, response.text
    sent = fake.stats()["last_request"]
    for name, value in {**allowed, **openai}.items():
        assert sent[name] == value, name
    assert sent["return_token_ids"] is True  # what the gateway adds for capture still goes
