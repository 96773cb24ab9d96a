"""The served model's limits as clients are told them: the ``contextWindow`` and ``maxTokens`` of the client
configs on the key pages, from the ``max_model_len`` the upstreams' ``/v1/models`` report (the settings
CLAWHUB_MODEL_CONTEXT_WINDOW / CLAWHUB_MODEL_MAX_TOKENS override either). The gateway's pool reads
``max_model_len`` from the same answer (``max_model_len_of``) to clamp requests (clawhub/gateway/limits.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx

logger = logging.getLogger("clawhub.gateway")  # where its warning has always been logged


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


# Used when no upstream answered yet and none ever did: what a mid-sized served model offers.
FALLBACK_CONTEXT_WINDOW = 32768
SERVED_CACHE_KEY = "clawhub:served-max-model-len"
SERVED_FRESH_SECONDS = 60  # a restarted vLLM with another --max-model-len shows within a minute
SERVED_RETRY_SECONDS = 5  # after no upstream answered
SERVED_KEPT_SECONDS = 30 * 24 * 3600  # the last value seen, for while every upstream is down
SERVED_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class ModelLimits:
    context_window: int
    max_tokens: int
    source: str  # "served" (vLLM's max_model_len), "last-served", "settings" or "fallback"


def max_tokens_for(context_window: int) -> int:
    """The output limit advertised for a context: a quarter of it, between 256 and 8192 tokens (and never
    more than half). An agent sends it on every request and keeps that much of the context free for the
    answer, so a large value shrinks the history it keeps before compacting; a quarter leaves an OpenClaw
    prompt (13-17k tokens) plus its answer inside a 32k context, and the gateway clamps whatever does not
    fit anyway."""
    return max(1, min(8192, max(256, context_window // 4), context_window // 2))


def served_max_model_len(upstreams: list[dict]) -> int | None:
    """The smallest ``max_model_len`` the upstreams' ``/v1/models`` report (a client config must fit any
    replica it is routed to); None if none answered with one."""
    found = []
    for upstream in upstreams:
        headers = {"authorization": f"Bearer {upstream['api_key']}"} if upstream.get("api_key") else {}
        try:
            response = httpx.get(f"{upstream['url'].rstrip('/')}/v1/models", headers=headers,
                                 timeout=SERVED_TIMEOUT_SECONDS)
            models = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            models = None
        value = max_model_len_of(models, upstream.get("base_model") or "") if isinstance(models, list) \
            else None
        if value is not None:
            found.append(value)
    return min(found) if found else None


def served_limits() -> ModelLimits:
    """contextWindow and maxTokens for client configs: the served model's, cached; the settings
    CLAWHUB_MODEL_CONTEXT_WINDOW / CLAWHUB_MODEL_MAX_TOKENS override either. Web process only (Django)."""
    from django.conf import settings
    from django.core.cache import cache

    context, source = settings.MODEL_CONTEXT_WINDOW, "settings"
    if context is None:
        context = cache.get(SERVED_CACHE_KEY)  # 0: no upstream answered a moment ago; do not wait again
        if context is None:
            context = served_max_model_len(list(settings.CLAWHUB_UPSTREAMS)) or 0
            cache.set(SERVED_CACHE_KEY, context, SERVED_FRESH_SECONDS if context else SERVED_RETRY_SECONDS)
            if context:
                cache.set(f"{SERVED_CACHE_KEY}:last", context, SERVED_KEPT_SECONDS)
        source = "served"
        if not context:
            context, source = cache.get(f"{SERVED_CACHE_KEY}:last"), "last-served"
        if context is None:
            logger.warning("no upstream reported max_model_len; advertising %d tokens of context",
                           FALLBACK_CONTEXT_WINDOW)
            context, source = FALLBACK_CONTEXT_WINDOW, "fallback"
    max_tokens = settings.MODEL_MAX_TOKENS
    if max_tokens is None:
        max_tokens = max_tokens_for(context)
    return ModelLimits(context_window=context, max_tokens=min(max_tokens, context), source=source)
