"""Talking to the vLLM upstreams from a worker: health, load and unload of an adapter, one generation.

The gateway keeps its own in-process view of what each upstream holds (clawhub.gateway.upstreams); these calls
go straight to the upstreams so that promotion does not depend on any gateway process. Loads, unloads and
listings go through the one admin client (clawhub.adapters.vllm_admin), which the gateway uses too: a second
load of the same name counts as loaded, an unload of a name the upstream does not hold as unloaded, so every
call here is safe to repeat.
"""

import logging
from dataclasses import dataclass

import httpx
from django.conf import settings

from clawhub.adapters.vllm_admin import VllmAdmin, adapter_names
from clawhub.core.exceptions import ClawHubError
from workers.upstream_errors import body_shape  # what an error body looked like, never its text

logger = logging.getLogger("clawhub.adapters")

HEALTH_TIMEOUT = 3.0


class UpstreamUnavailable(ClawHubError):
    status = 502
    code = "upstream_unavailable"


@dataclass(frozen=True)
class UpstreamTarget:
    url: str
    base_model: str
    api_key: str = ""

    @property
    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers


def configured_upstreams() -> list[UpstreamTarget]:
    return [
        UpstreamTarget(
            url=c["url"].rstrip("/"), base_model=c.get("base_model") or "base", api_key=c.get("api_key") or ""
        )
        for c in settings.CLAWHUB_UPSTREAMS
    ]


def _client() -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(settings.CLAWHUB_ADAPTER_LOAD_TIMEOUT, connect=5.0))


def healthy_upstreams(upstreams: list[UpstreamTarget] | None = None) -> list[UpstreamTarget]:
    found = []
    with _client() as client:
        for up in configured_upstreams() if upstreams is None else upstreams:
            try:
                if client.get(f"{up.url}/health", timeout=HEALTH_TIMEOUT).status_code == 200:
                    found.append(up)
            except httpx.HTTPError:
                logger.warning("upstream %s does not answer /health", up.url)
    return found


def _admin(up: UpstreamTarget) -> VllmAdmin:
    return VllmAdmin(up.url, up.headers)


def load_adapter(up: UpstreamTarget, *, name: str, path: str) -> None:
    try:
        with _client() as client:
            answer = _admin(up).load(client, name=name, path=path)
    except httpx.HTTPError as exc:
        raise UpstreamUnavailable(f"Loading {name} on {up.url} failed: {exc}", upstream=up.url) from exc
    if not answer.done:
        raise UpstreamUnavailable(f"{up.url} refused to load {name}: {answer.status} {answer.shape}",
                                  upstream=up.url)


def unload_adapter(up: UpstreamTarget, *, name: str) -> bool:
    """True when the upstream no longer holds the adapter (unloaded now, or it never had it)."""
    try:
        with _client() as client:
            answer = _admin(up).unload(client, name=name)
    except httpx.HTTPError as exc:
        logger.warning("unloading %s on %s failed: %s", name, up.url, exc)
        return False
    if not answer.done:
        logger.warning("unloading %s on %s: %s %s", name, up.url, answer.status, answer.shape)
    return answer.done


def listed_adapters(up: UpstreamTarget) -> set[str]:
    with _client() as client:
        return adapter_names(_admin(up).models(client, timeout=HEALTH_TIMEOUT))


def generate(
    up: UpstreamTarget,
    *,
    model: str,
    messages: list[dict],
    max_tokens: int,
    client: httpx.Client | None = None,
) -> str:
    """One greedy chat completion: the eval gate compares versions on the same prompts, without sampling
    noise."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    own = client is None
    client = client or _client()
    try:
        response = client.post(f"{up.url}/v1/chat/completions", headers=up.headers, json=body)
    except httpx.HTTPError as exc:
        raise UpstreamUnavailable(
            f"Generating with {model} on {up.url} failed: {exc}", upstream=up.url
        ) from exc
    finally:
        if own:
            client.close()
    if response.status_code != 200:
        raise UpstreamUnavailable(
            f"{up.url} answered {response.status_code} for {model}: {body_shape(response)}", upstream=up.url
        )
    choice = (response.json().get("choices") or [{}])[0]
    return ((choice.get("message") or {}).get("content")) or ""
