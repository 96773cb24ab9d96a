"""Training on Fireworks with its training SDK (fireworks-ai[training-sdk], pinned in the "remote" extra).

Why this path: the training SDK installs beside everything else (it pins pydantic<2.13 and pyqwest 0.10, which
tinker 0.38 and our stack accept), and it is the only Fireworks path that takes our own per-token advantages:
its FiretitanServiceClient speaks Tinker's protocol (a fork of the tinker SDK; forward_backward goes as JSON)
against Fireworks' serverless trainers, so the loop is protocol.TinkerProtocolBackend. Managed RFT jobs would
need an evaluator and a dataset instead of our judged samples.

Weights come back to our vLLM, like every other backend: save_weights_for_sampler(name) -> FireworksClient.
promote_session_checkpoint (a Fireworks model) -> Fireworks(...).models.get_download_endpoint (signed URL per
file) -> plain HTTP downloads -> weights.to_peft_adapter.
"""

from __future__ import annotations

import re
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from workers.trainer.remote.errors import RemoteTrainingError, RetryPolicy
from workers.trainer.remote.protocol import TinkerProtocolBackend
from workers.trainer.remote.tinker import _download

SERVERLESS_PATH = "/training/v1/serverless"


class FireworksBackend(TinkerProtocolBackend):
    """api_key / account_id: the Fireworks account's; base_url: the API root (default https://api.fireworks.ai;
    training goes to {base_url}/training/v1/serverless, models to {base_url}/v1/accounts/...);
    remote_base_model: Fireworks' model name (accounts/fireworks/models/...) when start() gets a local
    path."""

    name = "fireworks"
    supports_last_n = False  # its fork of compute_logprobs scores the whole prompt
    base_url: str  # always set: __init__ falls back to the public API root

    @classmethod
    def from_config(cls, config: Any) -> FireworksBackend:
        # No tokenizer option: it loads from the run's base_model (the model vLLM serves), whatever Fireworks
        # calls that model (remote_base_model).
        return cls(
            api_key=config.CLAWHUB_FIREWORKS_API_KEY,
            account_id=config.CLAWHUB_FIREWORKS_ACCOUNT_ID,
            base_url=config.CLAWHUB_FIREWORKS_BASE_URL or None,
            remote_base_model=config.CLAWHUB_FIREWORKS_BASE_MODEL or None,
            retry=RetryPolicy.from_config(config),
        )

    def __init__(
        self,
        *,
        api_key: str,
        account_id: str,
        base_url: str | None = None,
        remote_base_model: str | None = None,
        tokenizer: str | None = None,
        retry: RetryPolicy | None = None,
        loss_fn: str = "ppo",
    ) -> None:
        super().__init__(
            api_key=api_key,
            base_url=(base_url or "https://api.fireworks.ai").rstrip("/"),
            remote_base_model=remote_base_model,
            tokenizer=tokenizer,
            retry=retry,
            loss_fn=loss_fn,
        )
        if not account_id:
            raise RemoteTrainingError("fireworks: no account id configured", backend=self.name)
        self.account_id = account_id
        self._samplers: list[Any] = []  # sampling clients run their own event loop thread: closed in close()

    @property
    def sdk(self) -> Any:
        import fireworks.training.sdk as sdk

        return sdk

    def _make_service(self) -> Any:
        service = self.sdk.FiretitanServiceClient(
            base_url=self.base_url + SERVERLESS_PATH, api_key=self._api_key
        )
        # The SDK caches the account it would otherwise look up with an extra control-plane call; we know it.
        service._cp_account_id = self.account_id
        return service

    def _status_of(self, exc: BaseException) -> int | None:
        status = super()._status_of(exc)
        if status is None:
            # The control-plane helpers raise RuntimeError("... 401 ...") rather than a typed error.
            match = re.search(r"\b(401|403|429|5\d\d)\b", str(exc))
            status = int(match.group(1)) if match and isinstance(exc, RuntimeError) else None
        return status

    # Teacher log-probs (OPD, Combine) come from the inherited _teacher_sampler: on a serverless session,
    # create_sampling_client(base_model=...) samples the session's base weights (adapter off)
    # through {base_url}/training/v1/serverless/inference/v1/completions with echo + logprobs.

    def _policy_sampler(self) -> Any:
        """pi_old for turns captured without log-probs, and the policy's top-k for choosing among hints.
        Fireworks' trainer has no combined save-and-sample call: snapshot the weights for sampling, then bind
        a sampler to that snapshot on this session."""
        name = f"clawhub-policy-{self.state.step:06d}-{uuid.uuid4().hex[:6]}"
        saved = self.call(
            "snapshot policy for sampling", lambda: self.training.save_weights_for_sampler(name)
        )
        # Named as a checkpoint of this session, the sampler is bound to the session's own route whatever
        # shape the trainer gave the path (the SDK appends a suffix to the name).
        checkpoint = saved.path.rstrip("/").rsplit("/", 1)[-1]
        path = (
            f"accounts/{self.account_id}/trainingSessions/{self.service.training_session_id}"
            f"/checkpoints/{checkpoint}"
        )
        sampler = self.call(
            "create policy sampling client", lambda: self.service.create_sampling_client(model_path=path)
        )
        self._samplers.append(sampler)
        return sampler

    def _teacher_sampler(self) -> Any:
        fresh = self._teacher is None
        sampler = super()._teacher_sampler()
        if fresh:
            self._samplers.append(sampler)
        return sampler

    def _topk(self, sampler: Any, tokens: list[int], n: int, k: int, what: str) -> list[set[int]]:
        """Top-k ids at the last n positions of `tokens`. The SDK's sample() refuses topk_prompt_logprobs, so
        ask its deployment sampler for `top_logprobs` on the echoed prompt (one generated token). The
        coroutine runs on the sampler's own event loop (_submit), where its HTTP client lives."""

        def request() -> Any:
            return sampler._submit(
                sampler.deployment_sampler.sample_with_prompt_tokens(
                    list(tokens), n=1, max_tokens=1, temperature=1.0, echo=True, logprobs=True, top_logprobs=k
                )
            )

        completions = self.call(what, request)
        rows = (completions[0].inference_topk_token_ids or []) if completions else []
        # Rows cover positions 1..len(tokens): the echoed prompt minus its first token, then the new one.
        rows = rows[:-1][-n:]
        if len(rows) != n:
            raise RemoteTrainingError(
                f"{self.name}: {what} returned incomplete top-k rows", backend=self.name
            )
        return [set(row) for row in rows]

    def _restart_from_state(self) -> None:
        """After a failed step: the SDK allows one training client per FiretitanServiceClient ("already
        exists on this service"), so the client restored from the last saved state gets a fresh service (and
        session); samplers bound to the old session are rebuilt on demand."""
        old = (self.training, self.service, self._samplers)
        self.service = self.call("reconnect", self._make_service)
        self.training = self._client_from_state(self.state.state_path)  # type: ignore[arg-type]  # saved in start()
        self.state.model_id = self._model_id() or self.state.model_id
        self._teacher, self._samplers = None, []
        for client in (*old[2], *old[:2]):
            try:
                client.close()
            except Exception:  # closing is best effort: the abandoned session times out remotely anyway
                pass

    def close(self) -> None:
        for sampler in self._samplers:
            try:
                sampler.close()
            except Exception:  # closing is best effort: the run's outcome is already decided
                pass
        self._samplers = []
        super().close()

    def _fetch_weights(self, out_dir: Path) -> dict[str, str]:
        from fireworks import Fireworks
        from fireworks.training.sdk.fireworks_client import FireworksClient

        checkpoint = f"clawhub-step-{self.state.step:06d}-{uuid.uuid4().hex[:6]}"
        saved = self.call("save weights", lambda: self.training.save_weights_for_sampler(checkpoint))
        session = self.service.training_session_id
        if not session:
            raise RemoteTrainingError(
                "fireworks: the trainer did not open a serverless session", backend=self.name
            )
        # The SDK makes the name unique (it appends a suffix): the checkpoint id is what the trainer answered.
        checkpoint_id = saved.path.rstrip("/").rsplit("/", 1)[-1]
        model_id = checkpoint  # Fireworks model ids: 1-63 chars of a-z, 0-9 and '-'
        control = FireworksClient(api_key=self._api_key, base_url=self.base_url)
        try:
            self.call(
                "promote checkpoint to a model",
                lambda: control.promote_session_checkpoint(
                    name=f"accounts/{self.account_id}/trainingSessions/{session}/checkpoints/{checkpoint_id}",
                    output_model_id=model_id,
                    base_model=self.remote_model,
                ),
            )
        finally:
            closer = getattr(control, "close", None)
            if callable(closer):
                closer()
        with Fireworks(api_key=self._api_key, account_id=self.account_id, base_url=self.base_url) as client:
            endpoint = self.call(
                "get download URLs",
                lambda: client.models.get_download_endpoint(model_id, account_id=self.account_id),
            )
        urls = endpoint.filename_to_signed_urls or {}
        if not urls:
            raise RemoteTrainingError(
                f"fireworks: model {model_id} has no files to download", backend=self.name
            )
        for relative, url in urls.items():
            target = (out_dir / relative).resolve()
            if out_dir.resolve() not in target.parents:
                raise RemoteTrainingError(
                    f"fireworks: refusing download path {relative!r}", backend=self.name
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            self.call(
                f"download {relative}", partial(_download, url, target, self.retry.call_timeout_s)
            )
        return {
            "weights_path": saved.path,
            "training_session": session,
            "model": f"accounts/{self.account_id}/models/{model_id}",
        }
