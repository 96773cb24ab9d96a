"""The served model's limits as clients are told them: the ``contextWindow`` and ``maxTokens`` of the client
configs on the key pages, from the base model's description (workers/base_models.py), the one that gives vLLM
its ``--max-model-len`` (workers/vllm_cpu.py); the settings CLAWHUB_MODEL_CONTEXT_WINDOW /
CLAWHUB_MODEL_MAX_TOKENS override either. Worked out in process: rendering a key page asks no server
anything, so it never waits on an upstream or trusts whatever listens on its port. The gateway's pool reads
``max_model_len`` from the upstreams' ``/v1/models`` (``max_model_len_of``) to clamp requests
(clawhub/gateway/limits.py), so a remote upstream started with a shorter context than its description is
clamped there; CLAWHUB_MODEL_CONTEXT_WINDOW tells clients.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from workers import base_models, vllm_cpu


def max_model_len_of(models: list, base_model: str) -> int | None:
    """The context length an upstream's ``/v1/models`` answer gives for its base model (adapters share it)."""
    found = None
    for model in models:
        if not isinstance(model, dict):
            continue
        value = model.get("max_model_len")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            if model.get("id") == base_model:
                return value
            found = found or value
    return found


@dataclass(frozen=True, slots=True)
class ModelLimits:
    context_window: int
    max_tokens: int
    source: str  # "settings" (CLAWHUB_MODEL_CONTEXT_WINDOW) or "model" (the base model's description)
    calls_tools: bool = True  # False: clients are told to send no tool schemas


def max_tokens_for(context_window: int) -> int:
    """The output limit advertised for a context: a quarter of it, between 256 and 8192 tokens (and never
    more than half). An agent sends it on every request and keeps that much of the context free for the
    answer, so a large value shrinks the history it keeps before compacting; a quarter leaves an OpenClaw
    prompt (13-17k tokens) plus its answer inside a 32k context, and the gateway clamps whatever does not
    fit anyway."""
    return max(1, min(8192, max(256, context_window // 4), context_window // 2))


def described_context_window() -> int:
    """The context the base model is served with: what ``manage.py serve`` gives the vLLM it starts
    (CLAWHUB_VLLM_ARGS included), or for upstreams elsewhere (CLAWHUB_UPSTREAMS) the description of
    CLAWHUB_BASE_MODEL, the folder they serve."""
    from django.conf import settings

    extra = shlex.split(settings.CLAWHUB_VLLM_ARGS) if settings.CLAWHUB_START_VLLM else ()
    return vllm_cpu.max_model_len(settings.CLAWHUB_BASE_MODEL, extra)


def served_limits() -> ModelLimits:
    """contextWindow and maxTokens for client configs: the served model's (maxTokens its description's, or a
    quarter of the context); the settings CLAWHUB_MODEL_CONTEXT_WINDOW / CLAWHUB_MODEL_MAX_TOKENS override
    either. And whether the model calls tools (its description). Web process only (Django)."""
    from django.conf import settings

    context, source = settings.MODEL_CONTEXT_WINDOW, "settings"
    if context is None:
        context, source = described_context_window(), "model"
    description = base_models.describe(settings.CLAWHUB_BASE_MODEL)
    max_tokens = settings.MODEL_MAX_TOKENS
    if max_tokens is None:
        max_tokens = description.max_tokens or max_tokens_for(context)
    return ModelLimits(context_window=context, max_tokens=min(max_tokens, context), source=source,
                       calls_tools=description.calls_tools)
