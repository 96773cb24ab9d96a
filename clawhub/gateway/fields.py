"""Which of vLLM's own request fields /v1 forwards, and within what bounds.

Every OpenAI field goes upstream untouched (tools, response_format, logprobs, stop, max_tokens…), and so does
any field neither OpenAI nor vLLM knows (vLLM ignores those). vLLM's extensions are different: some compile
a client's regex or grammar on the engine every tenant shares (``structured_outputs``, the older
``guided_*``), jump the queue (``priority``), reach into the engine (``kv_transfer_params``, ``vllm_xargs``,
``prompt_embeds``, ``request_id``) or multiply its work (``use_beam_search``). So vLLM's extensions are
refused unless listed in ``ALLOWED``, each with its bound, and ``n`` is bounded too.

The check is one pass over the body's top-level names (a set lookup each) before admission; only the fields
present are looked at further.
"""

from clawhub.gateway.errors import GatewayError, bad_request

N_MAX = 8  # completions per request (OpenAI's n); the tpm reservation counts max_tokens x n
LIST_MAX = 256  # items in a token-id or word list
KWARGS_MAX = 16  # entries in chat_template_kwargs
STRING_MAX = 256  # characters in cache_salt

_BOOL = "a boolean"
_INT = "an integer"
_NUMBER = "a number"

# vLLM's extension fields a tenant may send: what each must be.
ALLOWED: dict[str, str] = {
    "top_k": _INT, "min_p": _NUMBER, "repetition_penalty": _NUMBER, "length_penalty": _NUMBER,
    "min_tokens": _INT, "truncate_prompt_tokens": _INT, "thinking_token_budget": _INT,
    "prompt_logprobs": _INT, "stream_interval": _INT, "truncation_side": "a string",
    "include_stop_str_in_output": _BOOL, "ignore_eos": _BOOL, "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL, "add_generation_prompt": _BOOL, "continue_final_message": _BOOL,
    "add_special_tokens": _BOOL, "include_reasoning": _BOOL, "return_tokens_as_token_ids": _BOOL,
    "return_token_ids": _BOOL, "return_token_offsets": _BOOL, "return_prompt_text": _BOOL,
    "stop_token_ids": "a list", "allowed_token_ids": "a list", "bad_words": "a list",
    "logprob_token_ids": "a list", "chat_template_kwargs": "an object", "cache_salt": "a string",
}
# vLLM's extension fields (0.32 and the older names) that are refused.
REFUSED = frozenset({
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "structural_tag", "priority", "request_id",
    "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "prompt_embeds", "use_beam_search",
    "chat_template", "documents", "mm_processor_kwargs", "media_io_kwargs", "mm_payload", "return_mm_kwargs",
    "routed_experts_prompt_start", "repetition_detection", "watermarking", "logits_processors",
})
_LOOKED_AT = frozenset(ALLOWED) | REFUSED | {"n", "best_of"}


def _refuse(name: str, message: str) -> GatewayError:
    return bad_request(message, param=name, code="unsupported_parameter")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(value, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return _is_int(value)
    if kind == _NUMBER:
        return _is_int(value) or isinstance(value, float)
    if kind == "a string":
        return isinstance(value, str)
    if kind == "a list":
        return isinstance(value, list)
    return isinstance(value, dict)


def check_fields(body: dict) -> None:
    """Refuses (400, OpenAI-shaped, naming the field) a vLLM extension /v1 does not forward, one of the
    allowed ones out of its bounds, and ``n`` or ``best_of`` above N_MAX. ``null`` counts as absent."""
    for name in _LOOKED_AT.intersection(body):
        value = body[name]
        if value is None:
            continue
        if name in REFUSED:
            raise _refuse(name, f"'{name}' is not accepted: it is a vLLM engine option that this service "
                                "does not let clients set.")
        if name in ("n", "best_of"):
            if not _is_int(value) or not 1 <= value <= N_MAX:
                raise _refuse(name, f"'{name}' must be an integer from 1 to {N_MAX}.")
            continue
        kind = ALLOWED[name]
        if not _fits(value, kind):
            raise _refuse(name, f"'{name}' must be {kind}.")
        if kind == "a list" and len(value) > LIST_MAX:
            raise _refuse(name, f"'{name}' may hold at most {LIST_MAX} items.")
        if name == "chat_template_kwargs" and len(value) > KWARGS_MAX:
            raise _refuse(name, f"'{name}' may hold at most {KWARGS_MAX} entries.")
        if name == "cache_salt" and len(value) > STRING_MAX:
            raise _refuse(name, f"'{name}' may be at most {STRING_MAX} characters.")
