"""vLLM's LoRA admin API, in one place: load, unload and list the adapters an upstream serves.

vLLM answers 400 "already been loaded" to a second load of a name (another gateway, the promotion worker or
an earlier attempt did it), and 404, or 400 "not found" / "cannot be found", to unloading a name it does not
hold: both count as done, so every call is safe to repeat. The sync methods are for workers (promotion, the
drain sweep, account deletion: ``clawhub.adapters.serving``), the async ones for the gateway, on its pooled
client, when a tenant's first request needs its adapter (``clawhub.gateway.upstreams``). What a refusal means
(an error for the caller, a retry on the next sweep) is the caller's to say; the answer carries what it needs.

Plain httpx, no Django.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from workers.upstream_errors import body_shape  # what an error body looked like, never its text

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"


@dataclass(frozen=True, slots=True)
class Answer:
    """vLLM's answer to a load or an unload."""

    done: bool  # the upstream holds the name now (load), or no longer holds it (unload)
    already: bool  # it did so before this call (load: "already loaded"; unload: it never had it)
    status: int
    shape: str  # the error body's shape for logs and messages ("" when done)


def load_answer(response: httpx.Response) -> Answer:
    already = response.status_code == 400 and "already" in response.text
    done = response.status_code == 200 or already
    return Answer(done=done, already=already, status=response.status_code,
                  shape="" if done else body_shape(response))


def unload_answer(response: httpx.Response) -> Answer:
    status = response.status_code
    never = status == 404 or (status == 400 and ("not found" in response.text
                                                 or "cannot be found" in response.text))
    done = status == 200 or never
    return Answer(done=done, already=never, status=status, shape="" if done else body_shape(response))


def adapter_names(models: list[Any]) -> set[str]:
    """The LoRA adapters in ``/v1/models``'s data: the entries with a parent (the base model has none)."""
    return {m["id"] for m in models if isinstance(m, dict) and m.get("parent") and m.get("id")}


@dataclass(frozen=True, slots=True)
class VllmAdmin:
    """The admin endpoints of one upstream. ``headers`` carry the upstream's API key, if it has one."""

    url: str
    headers: Mapping[str, str]

    def _load_request(self, name: str, path: str) -> tuple[str, dict]:
        return f"{self.url}{LOAD_PATH}", {"lora_name": name, "lora_path": path}

    def load(self, client: httpx.Client, *, name: str, path: str,
             timeout: Any = httpx.USE_CLIENT_DEFAULT) -> Answer:
        """Raises httpx.HTTPError when the upstream does not answer."""
        url, body = self._load_request(name, path)
        return load_answer(client.post(url, headers=self.headers, json=body, timeout=timeout))

    async def load_async(self, client: httpx.AsyncClient, *, name: str, path: str,
                         timeout: Any = httpx.USE_CLIENT_DEFAULT) -> Answer:
        url, body = self._load_request(name, path)
        return load_answer(await client.post(url, headers=self.headers, json=body, timeout=timeout))

    def unload(self, client: httpx.Client, *, name: str,
               timeout: Any = httpx.USE_CLIENT_DEFAULT) -> Answer:
        """Raises httpx.HTTPError when the upstream does not answer."""
        return unload_answer(client.post(f"{self.url}{UNLOAD_PATH}", headers=self.headers,
                                         json={"lora_name": name}, timeout=timeout))

    def models(self, client: httpx.Client, *, timeout: Any = httpx.USE_CLIENT_DEFAULT) -> list[Any]:
        """``/v1/models``'s data; raises httpx.HTTPError when the upstream does not answer or refuses."""
        response = client.get(f"{self.url}{MODELS_PATH}", headers=self.headers, timeout=timeout)
        response.raise_for_status()
        return response.json().get("data", [])

    async def models_async(self, client: httpx.AsyncClient, *,
                           timeout: Any = httpx.USE_CLIENT_DEFAULT) -> list[Any] | None:
        """``/v1/models``'s data, or None when the upstream does not answer it properly (the gateway keeps its
        last view then)."""
        try:
            response = await client.get(f"{self.url}{MODELS_PATH}", headers=self.headers, timeout=timeout)
            models = response.json()["data"] if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return models if isinstance(models, list) else None
