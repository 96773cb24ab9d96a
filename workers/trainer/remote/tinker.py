"""Training on Tinker (thinking-machines `tinker` SDK, pinned in pyproject's "remote" extra).

The loop is protocol.TinkerProtocolBackend; what is Tinker's own: the ServiceClient (base URL and X-API-Key),
and how weights come back: save_weights_external -> RestClient.get_external_weights_urls (signed URL per file)
-> plain HTTP downloads -> weights.to_peft_adapter, so the result is served by our vLLM like a local version.
"""

from __future__ import annotations

import logging
import os
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from workers.trainer.remote.errors import RemoteTrainingError, RetryPolicy
from workers.trainer.remote.protocol import TinkerProtocolBackend

# The SDK ships telemetry to the vendor by default; a worker should not phone home unless told to.
os.environ.setdefault("TINKER_TELEMETRY", "0")

logger = logging.getLogger("workers.trainer.remote.tinker")


class TinkerBackend(TinkerProtocolBackend):
    """api_key: a Tinker key ("tml-..."); base_url: None = the SDK's default (or TINKER_BASE_URL);
    remote_base_model: Tinker's name for the base model when `base_model` given to start() is a local path
    (the tokenizer is loaded from `tokenizer`, else from base_model)."""

    name = "tinker"

    @classmethod
    def from_config(cls, config: Any) -> TinkerBackend:
        # No tokenizer option: it loads from the run's base_model (the model vLLM serves), whatever Tinker
        # calls that model (remote_base_model).
        return cls(
            api_key=config.CLAWHUB_TINKER_API_KEY,
            base_url=config.CLAWHUB_TINKER_BASE_URL or None,
            remote_base_model=config.CLAWHUB_TINKER_BASE_MODEL or None,
            retry=RetryPolicy.from_config(config),
        )

    @property
    def sdk(self) -> Any:
        import tinker

        return tinker

    def _make_service(self) -> Any:
        return self.sdk.ServiceClient(base_url=self.base_url, api_key=self._api_key)

    def close(self) -> None:
        """Finishes the remote session with the run's outcome, which also stops the SDK's heartbeat thread
        (a ServiceClient left open keeps heartbeating, and warning, for the life of the worker process)."""
        service, self.service = self.service, None
        if service is not None:
            try:
                service.close(self.outcome).result(timeout=min(self.retry.call_timeout_s, 30.0))
            except Exception:  # closing is best effort: the run's outcome is already decided
                logger.debug("tinker: finishing the session failed", exc_info=True)
        super().close()

    def _fetch_weights(self, out_dir: Path) -> dict[str, str]:
        name = f"clawhub-step-{self.state.step:06d}-{uuid.uuid4().hex[:6]}"
        saved = self.call("save external weights", lambda: self.training.save_weights_external(name))
        rest = self.sdk.RestClient(base_url=self.base_url, api_key=self._api_key)
        try:
            urls = self.call("get download URLs", lambda: rest.get_external_weights_urls(saved.path)).urls
        finally:
            closer = getattr(rest, "close", None)
            if callable(closer):
                closer()
        for relative, url in urls.items():
            target = (out_dir / relative).resolve()
            if out_dir.resolve() not in target.parents:
                raise RemoteTrainingError(f"tinker: refusing download path {relative!r}", backend=self.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.call(
                f"download {relative}", partial(_download, url, target, self.retry.call_timeout_s)
            )
        return {"weights_path": saved.path}


def _download(url: str, target: Path, timeout: float) -> None:
    # Signed URLs carry their own authorization: no API key goes to the storage host.
    with httpx.stream("GET", url, timeout=timeout, follow_redirects=True) as response:
        response.raise_for_status()
        with open(target, "wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
