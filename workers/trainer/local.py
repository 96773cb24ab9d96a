"""LocalBackend: LoRA updates with torch + peft + transformers on this machine (GPU worker, or CPU for small
models). Reads top to bottom: start (model, adapter, optimizer, resume) -> train (prepare pi_old / teacher /
reference once, then optimizer steps with gradient accumulation, checkpoints at the config's cadence and after
the last step) -> export -> sample. What a train() call computes (the batch prepared once, each optimizer
step) is in local_update.py, the LocalUpdate half of this class.

Real model sizes: micro-batches are token budgets with the samples packed end to end (no padding, no attention
across samples); log-probs come from the hidden states at the response positions only, through the LM head a
chunk of positions at a time (the full-vocabulary float32 logits of a batch never exist at once); gradient
checkpointing is on by default on GPU; bf16 weights on GPU, the loss maths in float32. With resident=True (the
train worker) the base model stays loaded across runs (workers/trainer/resident.py), and several tenants'
backends can share one model for a multi-tenant pass (workers/trainer/multitenant.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from workers.trainer import checkpoint as ckpt
from workers.trainer import resident as resident_models
from workers.trainer.backend import (
    OPTIMIZER_STATE_DIR,
    DroppedSample,
    OnStep,
    StepMetrics,
    TrainConfig,
    TrainingBackend,
    TrainResult,
    TrainSample,
)
from workers.trainer.forward import (
    ModelLoader,
    Sampled,
    generate_samples,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    resolve_gradient_checkpointing,
)
from workers.trainer.local_update import LocalUpdate, _key

log = logging.getLogger(__name__)


# TrainConfig fields that say where a run executes, not what it computes: a resume may change them.
RUNTIME_FIELDS = ("device", "dtype", "gradient_checkpointing", "checkpoint_seconds")


class LocalBackend(LocalUpdate, TrainingBackend):
    name = "local"

    def __init__(self, model_loader: ModelLoader = load_pretrained, *, resident: bool = False):
        # The benchmark swaps in a loader that builds a randomly initialised large model in place.
        self.model_loader = model_loader
        # resident: take the base from this process's resident models (loaded once, kept across runs) and
        # detach the adapter on close(), instead of loading a private copy per run.
        self.resident = resident
        self._lease: resident_models.Resident | None = None
        self.adapter = "default"  # the adapter's name in the peft model (a multi-tenant pass names each)
        self.shared = False  # in a multi-tenant pass: every forward goes through the per-segment LoRA
        self.runtime: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: Any) -> LocalBackend:
        # The train worker keeps the base model loaded across runs and only swaps tenants' adapters.
        return cls(resident=True)

    # -------------------------------------------------------------------------------------- start / resume

    def start(
        self, base_model: str, parent_adapter_dir: str | None, config: TrainConfig, workdir: str
    ) -> None:
        self._setup(base_model, config, workdir)
        started = time.monotonic()
        if self.resident:
            self._lease = resident_models.acquire(self.base_model, self.dtype, self.device, self.model_loader)
            base, self.tokenizer = self._lease.model, self._lease.tokenizer
            self.runtime["resident"] = resident_models.stats()
        else:
            base, self.tokenizer = self.model_loader(self.base_model, self.dtype, self.device)
            if self.tokenizer.pad_token_id is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
        self.runtime["base_seconds"] = round(time.monotonic() - started, 3)
        self._set_checkpointing(base)
        self._attach(base, parent_adapter_dir)
        self._begin_run(parent_adapter_dir)

    def _setup(self, base_model: str, config: TrainConfig, workdir: str) -> None:
        self.config = config
        self.base_model = str(base_model)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.gradient_checkpointing = resolve_gradient_checkpointing(
            config.gradient_checkpointing, self.device
        )

    def _set_checkpointing(self, base: Any) -> None:
        # Set per run: the resident base keeps whatever the previous run asked for otherwise.
        if not getattr(base, "supports_gradient_checkpointing", False):
            return
        if self.gradient_checkpointing:
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            getattr(base, "activation_checkpointing_disable", base.gradient_checkpointing_disable)()

    def _attach(self, model: Any, parent_adapter_dir: str | None) -> None:
        """Put this run's adapter on `model` (a bare base, or the peft model of a multi-tenant pass that
        already carries other tenants' adapters) and build its optimizer over that adapter only."""
        config = self.config
        latest = ckpt.latest_checkpoint(self.workdir)
        source = str(latest / "adapter") if latest is not None else parent_adapter_dir
        # Seeded right before the adapter is made: a fresh LoRA's A matrix is the same whether the base was
        # loaded just now or long ago, alone or next to other tenants.
        torch.manual_seed(config.seed)
        # The adapter in the base's dtype (peft would cast a bf16 base's adapter up to float32, and every
        # LoRA matmul would then cast its tokens' activations to float32 too); the optimizer keeps float32
        # master copies of a half-precision adapter (below).
        same_dtype = {"adapter_name": self.adapter, "autocast_adapter_dtype": False}
        if source:
            # The parent's own LoRA shape is kept: a new version must load wherever the parent did.
            if isinstance(model, PeftModel):
                model.load_adapter(source, is_trainable=True, **same_dtype)
            else:
                model = PeftModel.from_pretrained(model, source, is_trainable=True, **same_dtype)
        else:
            lora = LoraConfig(
                r=config.lora_r,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=list(config.target_modules),
                task_type="CAUSAL_LM",
            )
            if isinstance(model, PeftModel):
                model.add_adapter(self.adapter, lora, autocast_adapter_dtype=False)
            else:
                model = get_peft_model(model, lora, **same_dtype)
        self.model = model
        self.params = resident_models.adapter_weights(model, self.adapter)
        for p in self.params:  # peft marks only its active adapter trainable; a pass trains all of them
            p.requires_grad_(True)
        # Mixed precision: a bf16 adapter's updates (lr x ~1) are below bf16's resolution of its weights, so
        # AdamW steps float32 masters, with float32 moments, and the adapter gets the masters rounded. A
        # resumed run's masters are its checkpoint's bf16 weights (the low bits since are not kept).
        half = bool(self.params) and self.params[0].dtype in (torch.bfloat16, torch.float16)
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params] if half else []
        self.optimizer = torch.optim.AdamW(
            self.masters or self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )

    def _begin_run(self, parent_adapter_dir: str | None) -> None:
        config = self.config
        latest = ckpt.latest_checkpoint(self.workdir)
        self.resumed_from_step: int | None = None
        # Optimizer continuity: a run continuing a parent version continues the parent's AdamW as well (its
        # moments and bias-correction step), so that a run of one step is not Adam's first, sign-like step.
        self.optimizer_resumed_at: int | None = None
        self.optimizer_note = ""
        if latest is None and parent_adapter_dir:
            self.optimizer_resumed_at, self.optimizer_note = ckpt.restore_optimizer_state(
                Path(parent_adapter_dir) / OPTIMIZER_STATE_DIR / self.name,
                model=self.model,
                optimizer=self.optimizer,
                adapter=self.adapter,
                optimized=self.optimized,
            )
            if self.optimizer_note:
                log.info("%s: fresh optimizer: %s", parent_adapter_dir, self.optimizer_note)
        if latest is not None:
            state, optimizer_state, prepared, rng = ckpt.load_checkpoint(latest)
            if state["base_model"] != self.base_model:
                raise ValueError(
                    f"workdir {self.workdir} holds a run of {state['base_model']!r}, "
                    f"not {self.base_model!r}; use a fresh workdir for a different base model"
                )
            # A changed config would silently change the remaining steps' plan or maths; where the run
            # executes (device, dtype, activation checkpointing) may change.
            saved = {k: v for k, v in state["config"].items() if k not in RUNTIME_FIELDS}
            current = config.to_dict()
            changed = sorted(k for k, v in saved.items() if current.get(k) != v)
            # A run checkpointed before a field existed ran with what is now that field's default.
            changed += sorted(
                k for k in set(current) - set(state["config"]) - set(RUNTIME_FIELDS)
                if current[k] != TrainConfig.__dataclass_fields__[k].default
            )
            if changed:
                raise ValueError(
                    f"workdir {self.workdir} holds a run with a different TrainConfig "
                    f"({', '.join(changed)}): resume with the run's stored config, or use a fresh workdir"
                )
            self.optimizer.load_state_dict(optimizer_state)
            ckpt.restore_rng(rng)
            self.state, self.prepared = state, prepared
            self.resumed_from_step = state["step"]
            self.optimizer_resumed_at = state.get("optimizer_resumed_at")
            self.optimizer_note = state.get("optimizer_note", "")
            log.info("resumed %s from step %s", self.workdir, state["step"])
        else:
            self.state = {
                "step": 0,
                "base_model": self.base_model,
                "parent_adapter_dir": parent_adapter_dir,
                "config": config.to_dict(),
                "current": None,  # the train() call in progress: its sample ids and steps done
                "trained_sample_ids": [],
                "metrics": [],
                "optimizer_resumed_at": self.optimizer_resumed_at,
                "optimizer_note": self.optimizer_note,
            }
            self.prepared = None
        # No checkpoint of the starting state: a run that dies before its first checkpoint starts over from
        # its parent, which is that state (finish_step says when the next one is written).
        self._saved_at = time.monotonic()
        self._unsaved = False

    def _save(self) -> Path:
        self._saved_at = time.monotonic()
        self._unsaved = False
        return ckpt.save_checkpoint(
            self.workdir,
            step=self.state["step"],
            model=self.model,
            optimizer=self.optimizer,
            state=self.state,
            prepared=self.prepared,
            adapter=self.adapter,
        )

    @property
    def adapter_dir(self) -> str:
        latest = ckpt.latest_checkpoint(self.workdir)
        assert latest is not None, "end_train() writes a checkpoint"
        return str(latest / "adapter")

    # -------------------------------------------------------------------------------------- train

    def train(self, batch: list[TrainSample], on_step: OnStep | None = None) -> TrainResult:
        begun = self.begin_train(batch)
        if isinstance(begun, TrainResult):
            return begun
        while self.pending_steps():
            self.finish_step(self._optimizer_step(self.next_step_samples()), on_step)
        return self.end_train()

    def begin_train(self, batch: list[TrainSample]) -> TrainResult | None:
        """Prepare a train() call (or find where a resumed one stands). A TrainResult when there is nothing
        left to do (a redelivered call that already finished)."""
        ids = [_key(s.sample_id) for s in batch]
        current = self.state["current"]
        self._resumed = None
        if current is not None and [_key(k) for k in current["sample_ids"]] == ids:
            self._resumed = self.state["step"] if current["done_steps"] < current["total_steps"] else None
            if self._resumed is None:  # a redelivered call that already finished: report it, train nothing
                return self._result(current)
        elif current is not None and current["done_steps"] < current["total_steps"]:
            raise RuntimeError(
                f"workdir {self.workdir} holds an unfinished train() on other samples "
                f"({len(current['sample_ids'])} samples, "
                f"step {current['done_steps']}/{current['total_steps']}): "
                "call train() with the same samples to finish it, or use a fresh workdir"
            )
        else:
            current = self._prepare(batch)
            self._unsaved = True
        self._current = current
        self._step_plan = self._plan(current["trainable_ids"])
        self._by_id = {_key(s.sample_id): s for s in batch}
        return None

    def pending_steps(self) -> bool:
        return self._current["done_steps"] < self._current["total_steps"]

    def next_step_samples(self) -> list[TrainSample]:
        return [self._by_id[_key(k)] for k in self._step_plan[self._current["done_steps"]]]

    def finish_step(self, metrics: StepMetrics, on_step: OnStep | None = None) -> None:
        """Record a finished optimizer step: metrics, a checkpoint when one is due (the call's last step, or
        checkpoint_seconds since the last), then the caller's on_step."""
        current = self._current
        if current["done_steps"] == 0:
            metrics.dropped = [DroppedSample(**d) for d in current["dropped"]]
        current["done_steps"] += 1
        self.state["metrics"].append(metrics.to_dict())
        if current["done_steps"] == current["total_steps"]:
            self.state["trained_sample_ids"] += current["trainable_ids"]
        self._unsaved = True
        due = time.monotonic() - self._saved_at >= self.config.checkpoint_seconds
        if due or current["done_steps"] == current["total_steps"]:
            self._save()
        if on_step is not None:
            on_step(metrics)

    def end_train(self) -> TrainResult:
        if self._unsaved:  # a call with no step to take (nothing trainable) still leaves its state
            self._save()
        result = self._result(self._current)
        result.resumed_from_step = self._resumed
        return result

    def _result(self, current: dict[str, Any]) -> TrainResult:
        first = current["first_metric"]
        return TrainResult(
            adapter_dir=self.adapter_dir,
            steps=self.state["step"],
            metrics=[StepMetrics.from_dict(m) for m in self.state["metrics"][first:]],
            dropped=[DroppedSample(**d) for d in current["dropped"]],
            trained_sample_ids=list(current["trainable_ids"]),
            sample_notes=dict(current.get("notes", {})),
            optimizer_resumed_at=self.optimizer_resumed_at,
            optimizer_note=self.optimizer_note,
            runtime=dict(self.runtime),
        )

    # -------------------------------------------------------------------------------------- export / sample

    def export_adapter(self, out_dir: str) -> str:
        out = Path(out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        ckpt.save_adapter(self.model, tmp, self.adapter)
        # vLLM and the registry read the base from the adapter config; point it at what we trained on.
        config_path = tmp / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = self.base_model
        config_path.write_text(json.dumps(config, indent=2))
        state_dir = tmp / OPTIMIZER_STATE_DIR / self.name
        ckpt.save_optimizer_state(
            state_dir, model=self.model, optimizer=self.optimizer, adapter=self.adapter,
            optimized=self.optimized,
        )
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        return str(out)

    def sample(
        self,
        prompts: list[list[dict[str, Any]]],
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        *,
        seed: int | None = None,
        with_adapter: bool = True,
    ) -> list[Sampled]:
        """On-policy samples (adapter on) or base-model samples (with_adapter=False) for evaluation."""
        with contextlib.nullcontext() if with_adapter else self.model.disable_adapter():
            return generate_samples(
                self.model,
                self.tokenizer,
                prompts,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
            )

    def close(self) -> None:
        """Free the run: its adapter detached from a resident base (which stays loaded, clean, for the next
        run), or the private model dropped. Safe after a failure at any point of start() or train()."""
        model = getattr(self, "model", None)
        for name in ("model", "optimizer", "params", "masters", "prepared", "_by_id"):
            if hasattr(self, name):
                delattr(self, name)
        lease, self._lease = self._lease, None
        if lease is not None:
            resident_models.release(lease, model if isinstance(model, PeftModel) else None)
        elif not self.shared:  # a pass's tenants: the pass releases the shared model once, for all
            del model
            resident_models.free_memory()
