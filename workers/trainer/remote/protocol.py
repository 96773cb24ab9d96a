"""The training loop shared by every backend that speaks Tinker's API (Tinker itself, Fireworks' training
SDK).

Read top to bottom: retry policy -> encode the batch (workers.trainer.batching, so remote batches equal local
ones) -> pi_old and teacher log-probs -> advantages (Binary RL, OPD or Combine: workers.trainer.losses) ->
datums (datums.py) -> forward_backward("ppo") and optim_step per step, with the state saved after each step
-> weights out as a PEFT directory (weights.py).

Subclasses provide the SDK module, the service client, and how trained weights come back as files.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from workers.trainer.backend import (
    DroppedSample,
    OnStep,
    StepMetrics,
    TrainConfig,
    TrainingBackend,
    TrainResult,
    TrainSample,
)
from workers.trainer.remote.datums import PreparedSample, build_advantages, datum_arrays
from workers.trainer.remote.errors import RemoteAuthError, RemoteTrainingError, RetryPolicy
from workers.trainer.remote.weights import REMOTE_FILE, parent_state_path, to_peft_adapter

logger = logging.getLogger(__name__)

STATE_FILE = "remote_state.json"  # in the run's workdir: what a redelivered task needs to resume


@dataclass
class RunState:
    """Persisted after every step so a redelivered task resumes after the last completed optimizer step."""

    step: int = 0
    state_path: str | None = None  # the service's checkpoint of weights + optimizer after `step`
    model_id: str | None = None
    trained_sample_ids: list[int | str] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, workdir: Path) -> RunState | None:
        path = workdir / STATE_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def save(self, workdir: Path) -> None:
        tmp = workdir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(workdir / STATE_FILE)  # atomic: a crash leaves the previous state readable


class TinkerProtocolBackend(TrainingBackend):
    """TrainingBackend over a Tinker-style SDK. Subclasses set `name`, `sdk` and implement the hooks."""

    name = "tinker-protocol"
    # Whether the sampling client can score only the last n prompt tokens (less work for the service).
    supports_last_n = True

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str | None = None,
        remote_base_model: str | None = None,
        tokenizer: str | None = None,
        retry: RetryPolicy | None = None,
        loss_fn: str = "ppo",
    ) -> None:
        if not api_key:
            raise RemoteAuthError(f"{self.name}: no API key configured", backend=self.name)
        self._api_key = api_key  # never logged, never written to the workdir
        self.base_url = base_url
        self.remote_base_model = remote_base_model
        self.tokenizer_source = tokenizer
        self.retry = retry or RetryPolicy()
        self.loss_fn = loss_fn
        self.service: Any = None
        self.training: Any = None
        self.state = RunState()
        self._tokenizer: Any = None
        self._teacher: Any = None
        # How the remote session ends when the backend is closed: "success" once the adapter was exported.
        self.outcome = "errored"

    def __repr__(self) -> str:  # keeps the key out of tracebacks and logs
        return f"<{type(self).__name__} base_url={self.base_url!r} model={self.remote_base_model!r}>"

    # ------------------------------------------------------------------ hooks

    @property
    def sdk(self) -> Any:
        """The SDK module that has ServiceClient-compatible types (Datum, ModelInput, AdamParams, ...)."""
        raise NotImplementedError

    def _make_service(self) -> Any:
        raise NotImplementedError

    def _fetch_weights(self, out_dir: Path) -> dict[str, str]:
        """Save the current weights remotely and download them as files into out_dir; returns remote ids."""
        raise NotImplementedError

    def _status_of(self, exc: BaseException) -> int | None:
        """The HTTP status behind an SDK exception (walking __cause__), or None."""
        seen = 0
        current: BaseException | None = exc
        while current is not None and seen < 8:
            status = getattr(current, "status_code", None)
            response = getattr(current, "response", None)
            if status is None and response is not None:
                status = getattr(response, "status_code", None)
            if isinstance(status, int):
                return status
            current = current.__cause__ or current.__context__
            seen += 1
        return None

    # ------------------------------------------------------------------ retries

    def _classify(self, exc: BaseException) -> str:
        """ "auth", "transient" or "fatal"."""
        status = self._status_of(exc)
        if status in (401, 403):
            return "auth"
        if status is not None and (status in (408, 409, 425, 429) or status >= 500):
            return "transient"
        if isinstance(exc, TimeoutError | ConnectionError):
            return "transient"
        connection_errors = tuple(
            getattr(self.sdk, n) for n in ("APIConnectionError", "APITimeoutError") if hasattr(self.sdk, n)
        )
        if connection_errors and isinstance(exc, connection_errors):
            return "transient"
        return "fatal"

    def call(self, what: str, fn: Callable[[], Any], *, on_retry: Callable[[], None] | None = None) -> Any:
        """Run fn (which returns an SDK future or a value) within the retry policy; see RetryPolicy."""
        last: BaseException | None = None
        for attempt in range(1, self.retry.attempts + 1):
            try:
                value = fn()
                if hasattr(value, "result") and callable(value.result):
                    value = value.result(timeout=self.retry.call_timeout_s)
                return value
            except RemoteTrainingError:
                raise
            except Exception as exc:  # classified below: only transient failures are retried
                kind = self._classify(exc)
                if kind == "auth":
                    which = "API key and account id" if self.name == "fireworks" else "API key"
                    raise RemoteAuthError(
                        f"{self.name} refused the credentials during {what} "
                        f"(HTTP {self._status_of(exc)}): check the {which}",
                        backend=self.name,
                    ) from exc
                if kind == "fatal":
                    raise RemoteTrainingError(
                        f"{self.name}: {what} failed: {type(exc).__name__}: {exc}", backend=self.name
                    ) from exc
                last = exc
                if attempt < self.retry.attempts:
                    delay = self.retry.delay(attempt)
                    logger.warning(
                        "%s: %s failed (%s), retry %d/%d in %.1fs",
                        self.name,
                        what,
                        type(exc).__name__,
                        attempt,
                        self.retry.attempts - 1,
                        delay,
                    )
                    time.sleep(delay)
                    if on_retry is not None:
                        on_retry()
        timeout = isinstance(last, TimeoutError)
        raise RemoteTrainingError(
            f"{self.name}: {what} did not succeed after {self.retry.attempts} attempts"
            f"{f' of up to {self.retry.call_timeout_s:g}s each' if timeout else ''}: "
            f"{type(last).__name__}: {last}",
            backend=self.name,
            transient=True,
        ) from last

    # ------------------------------------------------------------------ lifecycle

    def start(
        self, base_model: str, parent_adapter_dir: str | None, config: TrainConfig, workdir: str
    ) -> None:
        self.config = config
        self.base_model = base_model
        self.remote_model = self.remote_base_model or base_model
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.service = self.call("connect", self._make_service)
        saved = RunState.load(self.workdir)
        parent_state = parent_state_path(parent_adapter_dir, self.name)
        if saved is not None and saved.state_path:
            self.state = saved
            self.resumed_from_step: int | None = saved.step
            self.training = self._client_from_state(saved.state_path)
        else:
            self.resumed_from_step = None
            if parent_state:
                # Continue the parent version where it was trained (its weights and optimizer live remotely).
                self.training = self._client_from_state(parent_state)
            else:
                self.training = self.call(
                    "create LoRA training client",
                    lambda: self.service.create_lora_training_client(
                        base_model=self.remote_model, rank=config.lora_r, seed=config.seed
                    ),
                )
            self.state = RunState(model_id=self._model_id())
            # A state at step 0, so even a failure in the first step can be retried on a fresh client.
            self._save_state()

    def _client_from_state(self, path: str) -> Any:
        return self.call(
            f"restore training state {path}",
            lambda: self.service.create_training_client_from_state_with_optimizer(path),
        )

    def _model_id(self) -> str | None:
        return (
            getattr(self.training, "model_id", None)
            or getattr(self.training, "_guaranteed_model_id", lambda: None)()
        )

    def _save_state(self) -> None:
        name = f"step-{self.state.step:06d}-{uuid.uuid4().hex[:6]}"
        response = self.call(f"save state {name}", lambda: self.training.save_state(name))
        self.state.state_path = response.path
        self.state.save(self.workdir)

    def remote_ids(self) -> dict[str, str]:
        ids = {"backend": self.name, "base_model": str(getattr(self, "remote_model", ""))}
        if self.state.model_id:
            ids["training_run_id"] = self.state.model_id
        if self.state.state_path:
            ids["state_path"] = self.state.state_path
        ids.update(getattr(self, "_weights_ids", {}))
        return ids

    def close(self) -> None:
        for client in (self.training, self.service):
            closer = getattr(client, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception:  # closing is best effort: the run's outcome is already decided
                    logger.debug("%s: close failed", self.name, exc_info=True)
        self.training = self.service = None

    # ------------------------------------------------------------------ preparing the batch

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_source or self.base_model)
        return self._tokenizer

    def _model_input(self, tokens: list[int]) -> Any:
        return self.sdk.ModelInput.from_ints(tokens)

    def _response_logprobs(self, sampler: Any, tokens: list[int], n: int, what: str) -> list[float]:
        """log p of the last n tokens of `tokens` under `sampler` (a prefill)."""
        prompt = self._model_input(tokens)
        if self.supports_last_n:
            logprobs = self.call(what, lambda: sampler.compute_logprobs(prompt, prompt_logprobs_last_n=n))
        else:
            logprobs = self.call(what, lambda: sampler.compute_logprobs(prompt))
        tail = list(logprobs[-n:])
        if len(tail) != n or any(x is None or not math.isfinite(x) for x in tail):
            raise RemoteTrainingError(f"{self.name}: {what} returned incomplete log-probs", backend=self.name)
        return [float(x) for x in tail]

    def _topk(self, sampler: Any, tokens: list[int], n: int, k: int, what: str) -> list[set[int]]:
        """Top-k token ids at each of the last n positions of `tokens` under `sampler`."""
        response = self.call(
            what,
            lambda: sampler.sample(
                prompt=self._model_input(tokens),
                num_samples=1,
                sampling_params=self.sdk.SamplingParams(max_tokens=1),
                include_prompt_logprobs=True,
                topk_prompt_logprobs=k,
            ),
        )
        rows = list(response.topk_prompt_logprobs or [])[-n:]
        return [{token for token, _ in (row or [])} for row in rows]

    def _teacher_sampler(self) -> Any:
        # The teacher is the base model with the adapter disabled, never the policy itself: the policy as
        # its own teacher collapses within a few updates.
        if self._teacher is None:
            self._teacher = self.call(
                "create teacher sampling client",
                lambda: self.service.create_sampling_client(base_model=self.remote_model),
            )
        return self._teacher

    def _policy_sampler(self) -> Any:
        return self.call("snapshot policy for sampling", self.training.save_weights_and_get_sampling_client)

    def prepare(self, batch: list[TrainSample]) -> tuple[list[PreparedSample], list[DroppedSample]]:
        """Encode like the local backend, fill in pi_old and teacher log-probs, compute advantages."""
        from workers.trainer.batching import encode_batch, prompt_ids, with_hint
        from workers.trainer.hints import choose_hint, dedupe_hints

        config = self.config
        encoded, dropped = encode_batch(
            self.tokenizer, batch, max_seq_len=config.max_seq_len, truncate_response=config.truncate_response
        )
        uses_teacher = config.method in ("opd", "combine")
        policy = None
        for enc in encoded:
            if enc.old_logprobs is not None and enc.sample.sampler != (1.0, 1.0, 0):
                # The services score the policy at temperature 1 with nothing filtered: log-probs of a reply
                # sampled otherwise would not be the denominator of that ratio.
                enc.old_logprobs = None
                enc.alignment += "; pi_old recomputed: the remote service scores at temperature 1"
        needs_policy = any(e.old_logprobs is None for e in encoded) or (
            uses_teacher and any(len(dedupe_hints(e.sample.hints)) > 1 for e in encoded)
        )
        if needs_policy:
            policy = self._policy_sampler()
        prepared: list[PreparedSample] = []
        for enc in encoded:
            sample, n = enc.sample, len(enc.response_ids)
            full = enc.prompt_ids + enc.response_ids
            old = enc.old_logprobs
            if old is None:
                old = self._response_logprobs(policy, full, n, f"pi_old of sample {sample.sample_id}")
            teacher, hint = None, None
            hints = dedupe_hints(sample.hints) if uses_teacher else []
            if hints:
                contexts = [
                    prompt_ids(self.tokenizer, with_hint(sample.messages, h), sample.tools) + enc.response_ids
                    for h in hints
                ]
                choice = 0
                if len(hints) > 1:
                    k = config.topk_overlap
                    policy_topk = self._topk(
                        policy, full, n, k, f"policy top-{k} of sample {sample.sample_id}"
                    )
                    overlaps = []
                    for i, ctx in enumerate(contexts):
                        teacher_topk = self._topk(self._teacher_sampler(), ctx, n, k, f"teacher top-{k} #{i}")
                        overlaps.append(
                            sum(len(a & b) for a, b in zip(policy_topk, teacher_topk, strict=False))
                        )
                    choice = choose_hint(hints, overlaps)
                hint = hints[choice]
                teacher = self._response_logprobs(
                    self._teacher_sampler(),
                    contexts[choice],
                    n,
                    f"teacher log-probs of sample {sample.sample_id}",
                )
            advantages = build_advantages(config, sample.reward, old, teacher)
            if advantages is None:
                why = "reward 0: no RL signal" if config.method == "rl" else "no hint and no reward"
                dropped.append(DroppedSample(sample.sample_id, why))
                continue
            prepared.append(PreparedSample(sample, enc.prompt_ids, enc.response_ids, old, advantages, hint))
        return prepared, dropped

    # ------------------------------------------------------------------ training

    def _datums(self, group: list[PreparedSample], samples_in_step: int) -> list[Any]:
        datums = []
        for p in group:
            arrays = datum_arrays(p, p.sample.weight / (len(p.response_ids) * samples_in_step))
            datums.append(
                self.sdk.Datum(
                    model_input=self._model_input(arrays.pop("model_input")),
                    loss_fn_inputs=arrays,
                )
            )
        return datums

    def _steps(self, prepared: list[PreparedSample]) -> list[list[PreparedSample]]:
        steps = []
        for _ in range(self.config.epochs):
            start = 0
            for size in self.config.step_sizes(len(prepared)):
                steps.append(prepared[start : start + size])
                start += size
        return steps[: self.config.max_steps] if self.config.max_steps else steps

    def _restart_from_state(self) -> None:
        """After a failed step: a fresh client from the last saved state, so nothing is applied twice and no
        request of the abandoned client (which the SDK orders per client) blocks the retry."""
        old = self.training
        # start() saved a state before the first step, so there is always one to restore.
        self.training = self._client_from_state(self.state.state_path)  # type: ignore[arg-type]
        closer = getattr(old, "close", None)
        if callable(closer):
            try:
                closer()
            except Exception:
                logger.debug("%s: closing the abandoned client failed", self.name, exc_info=True)

    def _run_step(self, step_samples: list[PreparedSample]) -> tuple[float, dict[str, float]]:
        config = self.config
        loss_config = {"clip_low_threshold": 1 - config.eps_low, "clip_high_threshold": 1 + config.eps_high}
        loss = 0.0
        size = config.micro_batch_size
        for i in range(0, len(step_samples), size):
            datums = self._datums(step_samples[i : i + size], len(step_samples))
            output = self.training.forward_backward(datums, self.loss_fn, loss_config).result(
                timeout=self.retry.call_timeout_s
            )
            loss += float(output.metrics.get("loss:sum", 0.0))
        adam = self.sdk.AdamParams(
            learning_rate=config.lr,
            beta1=config.betas[0],
            beta2=config.betas[1],
            weight_decay=config.weight_decay,
            grad_clip_norm=config.max_grad_norm,
        )
        response = self.training.optim_step(adam).result(timeout=self.retry.call_timeout_s)
        return loss, dict(getattr(response, "metrics", None) or {})

    def train(self, batch: list[TrainSample], on_step: OnStep | None = None) -> TrainResult:
        prepared, dropped = self.prepare(batch)
        steps = self._steps(prepared)
        new_metrics: list[StepMetrics] = []
        for index, step_samples in enumerate(steps, start=1):
            if index <= self.state.step:
                continue  # done before a redelivery: the saved state already holds it
            started = time.monotonic()
            loss, extra = self.call(
                f"step {index}", partial(self._run_step, step_samples), on_retry=self._restart_from_state
            )
            self.state.step = index
            self._save_state()
            ids = [p.sample.sample_id for p in step_samples]
            self.state.trained_sample_ids += [i for i in ids if i not in self.state.trained_sample_ids]
            metrics = StepMetrics(
                step=index,
                loss=loss,
                mean_reward=sum(p.sample.reward for p in step_samples) / len(step_samples),
                mean_advantage=sum(sum(p.advantages) / len(p.advantages) for p in step_samples)
                / len(step_samples),
                tokens=sum(len(p.tokens) for p in step_samples),
                seconds=time.monotonic() - started,
                samples=len(step_samples),
                sample_ids=ids,
                grad_norm=float(extra.get("grad_norm", 0.0)),
                dropped=dropped if index == 1 else [],
            )
            self.state.metrics.append(metrics.to_dict())
            self.state.save(self.workdir)
            new_metrics.append(metrics)
            if on_step is not None:
                on_step(metrics)
        return TrainResult(
            adapter_dir=str(self.workdir / "adapter"),
            steps=self.state.step,
            metrics=new_metrics,
            dropped=dropped,
            trained_sample_ids=list(self.state.trained_sample_ids),
            resumed_from_step=self.resumed_from_step,
        )

    # ------------------------------------------------------------------ weights out

    def export_adapter(self, out_dir: str) -> str:
        out = Path(out_dir)
        staging = self.workdir / f"download-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        try:
            self._weights_ids = self._fetch_weights(staging)
            to_peft_adapter(staging, out, base_model=self.base_model)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        (out / REMOTE_FILE).write_text(json.dumps({**self.remote_ids(), "step": self.state.step}, indent=2))
        self.outcome = "success"
        return str(out)
