"""Talking to the vLLM upstreams from a worker: health, load and unload of an adapter, one generation.

The gateway keeps its own in-process view of what each upstream holds (clawhub.gateway.upstreams); these calls
go straight to the upstreams so that promotion does not depend on any gateway process. vLLM answers 400
"already been loaded" to a second load of the same name (another gateway or an earlier attempt did it): that
counts as loaded, which makes every call here safe to repeat.
"""

import logging
from dataclasses import dataclass

import httpx
from django.conf import settings

from clawhub.core.exceptions import ClawHubError
from workers.judge.judges import body_shape  # plain httpx: what an error body looked like, not its text

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


def load_adapter(up: UpstreamTarget, *, name: str, path: str) -> None:
    try:
        with _client() as client:
            response = client.post(
                f"{up.url}/v1/load_lora_adapter",
                headers=up.headers,
                json={"lora_name": name, "lora_path": path},
            )
    except httpx.HTTPError as exc:
        raise UpstreamUnavailable(f"Loading {name} on {up.url} failed: {exc}", upstream=up.url) from exc
    if response.status_code == 200 or (response.status_code == 400 and "already" in response.text):
        return
    raise UpstreamUnavailable(
        f"{up.url} refused to load {name}: {response.status_code} {body_shape(response)}", upstream=up.url
    )


def unload_adapter(up: UpstreamTarget, *, name: str) -> bool:
    """True when the upstream no longer holds the adapter (unloaded now, or it never had it)."""
    try:
        with _client() as client:
            response = client.post(
                f"{up.url}/v1/unload_lora_adapter", headers=up.headers, json={"lora_name": name}
            )
    except httpx.HTTPError as exc:
        logger.warning("unloading %s on %s failed: %s", name, up.url, exc)
        return False
    if response.status_code in (200, 404):
        return True
    if response.status_code == 400 and ("not found" in response.text or "cannot be found" in response.text):
        return True
    logger.warning("unloading %s on %s: %s %s", name, up.url, response.status_code, body_shape(response))
    return False


def listed_adapters(up: UpstreamTarget) -> set[str]:
    with _client() as client:
        response = client.get(f"{up.url}/v1/models", headers=up.headers, timeout=HEALTH_TIMEOUT)
    response.raise_for_status()
    return {m["id"] for m in response.json().get("data", []) if m.get("parent")}


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
