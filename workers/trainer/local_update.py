"""How a LocalBackend's train() call computes, once it has a model, an adapter and an optimizer (local.py
starts, resumes, checkpoints, exports and samples): prepare the batch once (pi_old, the chosen hint and its
teacher log-probs, the reference log-probs), then each optimizer step as micro-batches forward and backward
with their share of the step's loss, clipping and AdamW (on float32 masters for a half-precision adapter).
A multi-tenant pass (multitenant.py) calls the same step pieces for each tenant's backend.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workers.trainer.backend import DroppedSample, StepMetrics, TrainConfig, TrainSample
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
from workers.trainer.forward import response_stats
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


class LocalUpdate:
    """The prepare and step half of LocalBackend, which sets these attributes in start()."""

    config: TrainConfig
    model: Any
    tokenizer: Any
    adapter: str
    shared: bool
    device: torch.device
    state: dict[str, Any]
    prepared: dict[str, dict[str, Any]] | None
    params: list[torch.nn.Parameter]
    masters: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer

    def policy(self, spans: list[tuple[str | None, int, int | None]] | None = None):
        """Context for a forward (and its backward) through this run's policy. Alone, peft's own LoRA forward;
        in a multi-tenant pass, the per-segment LoRA over the shared model with `spans` (None = every token
        through this tenant's adapter)."""
        if not self.shared:
            return contextlib.nullcontext()
        from workers.trainer.lora_spans import segment_lora

        return segment_lora(self.model, spans or [(self.adapter, 0, None)])

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

        self._policy_logprobs(kept, prepared)

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
            self._reference_logprobs(prepared)

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

    def _policy_logprobs(self, kept: list[EncodedSample], prepared: dict[str, dict[str, Any]]) -> None:
        """pi_old: the policy at the start of this call (old_policy="start"), else the recorded log-probs
        and the current policy only for re-tokenized samples; the policy's top-K wherever a hint must be
        chosen."""
        cfg = self.config
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

    def _reference_logprobs(self, prepared: dict[str, dict[str, Any]]) -> None:
        """The reference log-probs for the KL term: the base model, adapter off, on the same tokens."""
        items = [(k, v) for k, v in prepared.items()]
        for chunk in self._chunks(items, _entry_length):
            with self.model.disable_adapter():
                logp, _ = self._forward(
                    [(v["prompt_ids"], v["response_ids"]) for _, v in chunk],
                    samplers=[v["sampler"] for _, v in chunk],
                )
            for i, (_, v) in enumerate(chunk):
                v["ref_logprobs"] = logp[i, : len(v["response_ids"])].tolist()

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
