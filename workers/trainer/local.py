"""LocalBackend: LoRA updates with torch + peft + transformers on this machine (GPU worker, or CPU for small
models). Reads top to bottom: start (model, adapter, optimizer, resume) -> train (prepare pi_old / teacher /
reference once, then optimizer steps with gradient accumulation, checkpoints at the config's cadence and after
the last step) -> export -> sample.

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
from collections.abc import Callable
from dataclasses import dataclass
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
from workers.trainer.batching import (
    Batch,
    EncodedSample,
    collate,
    collate_packed,
    encode_batch,
    pad_values,
    teacher_prompt_ids,
    token_budget_groups,
)
from workers.trainer.forward import (
    ModelLoader,
    Sampled,
    generate_samples,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    resolve_gradient_checkpointing,
    response_stats,
)
from workers.trainer.hints import choose_hint, dedupe_hints, topk_overlap
from workers.trainer.losses import (
    Sampler,
    aggregate,
    binary_rl_advantages,
    combine_advantages,
    opd_advantages,
    policy_loss,
)

log = logging.getLogger(__name__)


# TrainConfig fields that say where a run executes, not what it computes: a resume may change them.
RUNTIME_FIELDS = ("device", "dtype", "gradient_checkpointing", "checkpoint_seconds")


def _entry_length(item: tuple[str, dict[str, Any]]) -> int:
    return len(item[1]["prompt_ids"]) + len(item[1]["response_ids"])


def _recomputed_why(alignment: str) -> str:
    """The reason batching gave for recomputing pi_old, from a sample's alignment."""
    for part in alignment.split("; "):
        if "pi_old recomputed" in part or part.startswith("retokenized"):
            return "recomputed: " + part.replace(", pi_old recomputed", "").replace("pi_old recomputed: ", "")
    return "recomputed: " + alignment


def _key(sample_id: Any) -> str:
    # Sample ids round-trip through JSON in the checkpoint; compare them as strings.
    return str(sample_id)


# ------------------------------------------------------------------------------------------ the backend


@dataclass
class StepTotals:
    """A step's figures summed over its micro-batches."""

    loss: float = 0.0
    clip: float = 0.0
    kl: float = 0.0
    advantage: float = 0.0
    tokens: int = 0
    entropy: float = 0.0
    response_tokens: int = 0


class LocalBackend(TrainingBackend):
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

    def policy(self, spans: list[tuple[str | None, int, int | None]] | None = None):
        """Context for a forward (and its backward) through this run's policy. Alone, peft's own LoRA forward;
        in a multi-tenant pass, the per-segment LoRA over the shared model with `spans` (None = every token
        through this tenant's adapter)."""
        if not self.shared:
            return contextlib.nullcontext()
        from workers.trainer.lora_spans import segment_lora

        return segment_lora(self.model, spans or [(self.adapter, 0, None)])

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

    def _plan(self, trainable_ids: list[Any]) -> list[list[Any]]:
        """Sample ids of each optimizer step. Deterministic from the ids and config, so a resumed call
        recomputes the same plan."""
        cfg = self.config
        plan = []
        for epoch in range(cfg.epochs):
            order = list(trainable_ids)
            if epoch > 0:
                perm = torch.randperm(len(order), generator=torch.Generator().manual_seed(cfg.seed + epoch))
                order = [order[i] for i in perm.tolist()]
            start = 0
            for size in cfg.step_sizes(len(order)):
                plan.append(order[start : start + size])
                start += size
        return plan[: cfg.max_steps] if cfg.max_steps else plan

    # -------------------------------------------------------------------------------------- prepare

    @torch.no_grad()
    def _prepare(self, batch: list[TrainSample]) -> dict[str, Any]:
        """Everything an update needs that does not depend on theta, computed once before the first step and
        saved in the checkpoint: pi_old (recorded, else the current policy), the chosen hint and the teacher's
        log-probs (base model, adapter off, prompt + hint), the reference log-probs for the KL term."""
        cfg = self.config
        self.model.eval()
        encoded, dropped = encode_batch(
            self.tokenizer, batch, max_seq_len=cfg.max_seq_len, truncate_response=cfg.truncate_response
        )
        use_hints = cfg.method in ("opd", "combine")
        prepared: dict[str, dict[str, Any]] = {}
        kept: list[EncodedSample] = []
        for enc in encoded:
            sample = enc.sample
            lag = sample.version_lag
            if cfg.max_version_lag is not None and lag is not None and lag > cfg.max_version_lag:
                dropped.append(DroppedSample(
                    sample.sample_id,
                    f"served {lag} adapter versions behind the one trained (max_version_lag "
                    f"{cfg.max_version_lag})",
                ))
                continue
            hints = dedupe_hints(sample.hints) if use_hints else []
            has_score = cfg.method != "opd" and sample.reward != 0
            if not has_score and not hints:
                why = {"rl": "reward 0: no RL signal", "opd": "no hint", "combine": "reward 0 and no hint"}
                dropped.append(DroppedSample(sample.sample_id, why[cfg.method]))
                continue
            kept.append(enc)
            prepared[_key(sample.sample_id)] = {
                "prompt_ids": enc.prompt_ids,
                "response_ids": enc.response_ids,
                "old_logprobs": enc.old_logprobs,
                "reward": sample.reward if cfg.method != "opd" else 0,
                "hints": hints,
                "hint": None,
                "teacher_logprobs": None,
                "ref_logprobs": None,
                "alignment": enc.alignment,
                "sampler": sample.sampler,
                "version_lag": lag,
                "pi_old": "recorded" if enc.old_logprobs is not None else _recomputed_why(enc.alignment),
            }

        # pi_old: the policy at the start of this call (old_policy="start"), else the recorded log-probs and
        # the current policy only for re-tokenized samples; the policy's top-K wherever a hint must be chosen.
        if cfg.old_policy == "start":
            for entry in prepared.values():
                entry["old_logprobs"], entry["pi_old"] = None, "recomputed: old_policy 'start'"
        need_policy = [
            e
            for e in kept
            if prepared[_key(e.sample.sample_id)]["old_logprobs"] is None
            or len(prepared[_key(e.sample.sample_id)]["hints"]) > 1
        ]
        for chunk in self._chunks(need_policy, lambda e: len(e.prompt_ids) + len(e.response_ids)):
            with self.policy():
                logp, top = self._forward(
                    [(e.prompt_ids, e.response_ids) for e in chunk],
                    topk=cfg.topk_overlap,
                    samplers=[e.sample.sampler for e in chunk],
                )
            for i, e in enumerate(chunk):
                entry = prepared[_key(e.sample.sample_id)]
                n = len(e.response_ids)
                if entry["old_logprobs"] is None:
                    entry["old_logprobs"] = logp[i, :n].tolist()
                entry["policy_topk"] = top[i, :n]

        # Teachers: the base model with the adapter disabled, on prompt + hint + the same response tokens.
        self._teachers(kept, prepared)
        for enc in kept:
            entry = prepared[_key(enc.sample.sample_id)]
            entry.pop("policy_topk", None)
            if entry["reward"] == 0 and entry["hint"] is None:
                dropped.append(
                    DroppedSample(enc.sample.sample_id, "no usable hint (teacher context too long)")
                )
                del prepared[_key(enc.sample.sample_id)]

        if cfg.kl_coef > 0:
            items = [(k, v) for k, v in prepared.items()]
            for chunk in self._chunks(items, _entry_length):
                with self.model.disable_adapter():
                    logp, _ = self._forward(
                        [(v["prompt_ids"], v["response_ids"]) for _, v in chunk],
                        samplers=[v["sampler"] for _, v in chunk],
                    )
                for i, (_, v) in enumerate(chunk):
                    v["ref_logprobs"] = logp[i, : len(v["response_ids"])].tolist()

        trainable = [s.sample_id for s in batch if _key(s.sample_id) in prepared]
        current = {
            "sample_ids": [s.sample_id for s in batch],
            "trainable_ids": trainable,
            "dropped": [{"sample_id": d.sample_id, "reason": d.reason} for d in dropped],
            "done_steps": 0,
            "total_steps": len(self._plan(trainable)) if trainable else 0,
            "first_metric": len(self.state["metrics"]),
            # Per trained sample: where pi_old came from, the version lag, the sampler it was scored with.
            "notes": {
                k: {"pi_old": v["pi_old"], "version_lag": v["version_lag"], "sampler": list(v["sampler"])}
                for k, v in prepared.items()
            },
        }
        self.state["current"] = current
        self.prepared = prepared
        for d in dropped:
            log.info("dropped sample %s: %s", d.sample_id, d.reason)
        return current

    def _teachers(self, kept: list[EncodedSample], prepared: dict[str, dict[str, Any]]) -> None:
        """Teacher log-probs for every (sample, hint) pair in micro-batches; where a sample has several
        hints, keep the one with the highest top-K overlap with the policy."""
        pairs = []  # (sample key, hint, teacher prompt ids, response ids, sampler)
        for enc in kept:
            key = _key(enc.sample.sample_id)
            for hint in prepared[key]["hints"]:
                # Built on the student's own ids (served ids + the hint's), left-truncated alike.
                teacher_prompt, _ = teacher_prompt_ids(
                    self.tokenizer, enc, hint, max_seq_len=self.config.max_seq_len
                )
                if len(teacher_prompt) + len(enc.response_ids) <= self.config.max_seq_len:
                    pairs.append((key, hint, teacher_prompt, enc.response_ids, enc.sample.sampler))
        scored: dict[str, list[tuple[str, list[float], Any]]] = {}
        topk = self.config.topk_overlap if any(len(prepared[k]["hints"]) > 1 for k, *_ in pairs) else 0
        # The teacher is scored with the student's sampler: at another temperature the OPD term would not be
        # 0 even where teacher and student agree.
        for chunk in self._chunks(pairs, lambda pair: len(pair[2]) + len(pair[3])):
            with self.model.disable_adapter():
                logp, top = self._forward(
                    [(prompt, response) for _, _, prompt, response, _ in chunk],
                    topk=topk,
                    samplers=[sampler for *_, sampler in chunk],
                )
            for i, (key, hint, _, response, _) in enumerate(chunk):
                n = len(response)
                scored.setdefault(key, []).append((hint, logp[i, :n].tolist(), top[i, :n] if topk else None))
        for key, options in scored.items():
            entry = prepared[key]
            best = 0
            if len(options) > 1:
                overlaps = [topk_overlap(entry["policy_topk"], top) for _, _, top in options]
                best = choose_hint([hint for hint, _, _ in options], overlaps)
                entry["overlaps"] = overlaps
            entry["hint"], entry["teacher_logprobs"] = options[best][0], options[best][1]

    def _chunks(self, items: list, length: Callable[[Any], int]) -> list[list]:
        """Micro-batches: consecutive items up to micro_batch_tokens tokens each, else micro_batch_size."""
        budget = self.config.micro_batch_tokens
        if budget:
            groups = token_budget_groups([length(x) for x in items], budget)
            return [[items[i] for i in group] for group in groups]
        size = self.config.micro_batch_size
        return [items[i : i + size] for i in range(0, len(items), size)]

    def _collate(self, sequences: list[tuple[list[int], list[int]]]) -> Batch:
        if self.config.micro_batch_tokens:
            return collate_packed(
                sequences, pad_id=self.tokenizer.pad_token_id, row_tokens=self.config.pack_row_tokens
            )
        return collate(sequences, pad_id=self.tokenizer.pad_token_id, padding_side=self.config.padding_side)

    def _forward(
        self,
        sequences: list[tuple[list[int], list[int]]],
        topk: int = 0,
        samplers: list[tuple[float, float, int]] | None = None,
    ):
        sampler = Sampler.of(samplers, self.device) if samplers else None
        stats = response_stats(
            self.model, self._collate(sequences).to(self.device), topk=topk, sampler=sampler
        )
        return stats.logp.cpu(), (stats.top.cpu() if stats.top is not None else None)

    # -------------------------------------------------------------------------------------- one step

    def _optimizer_step(self, samples: list[TrainSample]) -> StepMetrics:
        """One optimizer step over `samples`: micro-batches (packed up to the token budget) forward and
        backward with their share of the step's loss, then clipping and AdamW."""
        started = time.monotonic()
        self.model.train()
        self.zero_grad()
        totals = StepTotals()
        for chunk in self._chunks(samples, self._length):
            entries = [self.entry(s) for s in chunk]
            batch = self._collate([(e["prompt_ids"], e["response_ids"]) for e in entries]).to(self.device)
            with self.policy():
                stats = response_stats(self.model, batch, sampler=self.sampler_of(chunk))
                loss = self.micro_batch_loss(
                    chunk, stats.logp, stats.entropy, batch.mask, len(samples), totals
                )
                loss.backward()
        return self.apply_step(samples, totals, started)

    def sampler_of(self, samples: list[TrainSample]) -> Sampler | None:
        """How each of these samples was sampled, one row each (what pi_theta is scored with)."""
        return Sampler.of([self.entry(s)["sampler"] for s in samples], self.device)

    def entry(self, sample: TrainSample) -> dict[str, Any]:
        """What _prepare kept of a sample of the train() call in progress: its ids, old log-probs, reward."""
        assert self.prepared is not None  # begin_train prepared the batch before any step
        return self.prepared[_key(sample.sample_id)]

    def _length(self, sample: TrainSample) -> int:
        entry = self.entry(sample)
        return len(entry["prompt_ids"]) + len(entry["response_ids"])

    def micro_batch_loss(
        self,
        samples: list[TrainSample],
        logp_new: torch.Tensor,
        entropy: torch.Tensor,
        response_mask: torch.Tensor,
        samples_in_step: int,
        totals: StepTotals,
    ) -> torch.Tensor:
        """This run's loss on some of a step's samples (rows of the micro-batch's (B, T) grid), scaled so the
        micro-batches' losses add up to the step's; the step's running figures go into `totals`."""
        cfg = self.config
        entries = [self.entry(s) for s in samples]
        width = response_mask.shape[1]
        logp_old = pad_values([e["old_logprobs"] for e in entries], width).to(self.device)
        advantages, mask = self._advantages(entries, logp_old, response_mask, width)
        logp_ref = None
        if cfg.kl_coef > 0:
            logp_ref = pad_values([e["ref_logprobs"] for e in entries], width).to(self.device)
        out = policy_loss(
            logp_new,
            logp_old,
            advantages,
            mask,
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            kl_coef=cfg.kl_coef,
            logp_ref=logp_ref,
            num_samples=samples_in_step,
            weights=torch.tensor([float(s.weight) for s in samples], device=self.device),
        )
        share = len(samples) / samples_in_step
        totals.loss += float(out.loss.detach())
        totals.clip += float(out.clip_fraction) * share
        totals.kl += float(out.kl)
        totals.advantage += float(aggregate(advantages, mask, samples_in_step))
        totals.tokens += int(mask.sum())
        totals.entropy += float((entropy * response_mask).sum())
        totals.response_tokens += int(response_mask.sum())
        return out.loss

    @property
    def optimized(self) -> dict[int, torch.Tensor]:
        """The tensor AdamW steps for each adapter weight (by id) where it is not the weight itself: the
        float32 masters of a half-precision adapter."""
        return {id(p): master for p, master in zip(self.params, self.masters, strict=False)}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=True)

    def step_optimizer(self) -> torch.Tensor:
        """Clip the accumulated gradient and step AdamW (on the float32 masters of a half-precision adapter,
        then rounded into it); returns the gradient norm before clipping."""
        for p, master in zip(self.params, self.masters, strict=False):
            master.grad = None if p.grad is None else p.grad.float()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters or self.params, self.config.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            for p, master in zip(self.params, self.masters, strict=False):
                p.copy_(master)
        self.zero_grad()
        return grad_norm

    def apply_step(self, samples: list[TrainSample], totals: StepTotals, started: float) -> StepMetrics:
        """Clip this run's gradient, step its optimizer, and say what the step was."""
        grad_norm = self.step_optimizer()
        self.state["step"] += 1
        rewards = [self.entry(s)["reward"] for s in samples]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's kernels are queued: its time is when they end
        return StepMetrics(
            step=self.state["step"],
            loss=totals.loss,
            mean_reward=sum(rewards) / len(rewards),
            mean_advantage=totals.advantage,
            tokens=totals.tokens,
            seconds=round(time.monotonic() - started, 4),
            samples=len(samples),
            sample_ids=[s.sample_id for s in samples],
            clip_fraction=totals.clip,
            kl=totals.kl,
            grad_norm=float(grad_norm),
            entropy=totals.entropy / max(totals.response_tokens, 1),
        )

    def _advantages(self, entries: list[dict[str, Any]], logp_old, response_mask, width: int):
        cfg = self.config
        rewards = torch.tensor([float(e["reward"]) for e in entries], device=self.device)
        if cfg.method == "rl":
            return binary_rl_advantages(rewards, response_mask)
        # No teacher for a turn without a usable hint: its teacher row equals pi_old, so the OPD term is 0.
        teacher = pad_values(
            [e["teacher_logprobs"] if e["hint"] is not None else e["old_logprobs"] for e in entries], width
        ).to(self.device)
        has_hint = torch.tensor([e["hint"] is not None for e in entries], device=self.device)
        if cfg.method == "opd":
            return opd_advantages(teacher, logp_old, has_hint, response_mask, cfg.w_opd, cfg.opd_clip)
        return combine_advantages(
            teacher, logp_old, rewards, has_hint, response_mask, cfg.w_opd, cfg.w_rl, cfg.opd_clip
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
        if with_adapter:
            return generate_samples(
                self.model,
                self.tokenizer,
                prompts,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
            )
        with self.model.disable_adapter():
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
