"""Multi-tenant passes: several tenants' batches trained in one forward/backward over one resident base.

Each tenant keeps what makes its update its own: its adapter (a named peft adapter on the shared model, so it
saves and loads exactly like a run's), its AdamW with the state of its parent version, its TrainConfig
(method, clip range, lr, step plan), its workdir and checkpoints, its loss and its gradient clipping. What is
shared is the base model's forward and backward: the optimizer steps of all tenants that have a step left are
packed together into token-budget rows, and every linear layer adds each tenant's LoRA only to its tenant's
tokens.

Per-sample LoRA: in each layer, one grouped LoRA over all the tenants of a micro-batch
(workers/trainer/lora_spans.py). The samples of a pass are packed tenant after tenant, so each adapter's
tokens are a few contiguous spans of the row; the layer stacks the tenants' A and B matrices, gathers the
tokens in blocks (each inside one span) and multiplies every block by its tenant's matrices in one batched
matmul pair, then puts the deltas back on their tokens: a fixed number of kernels per layer whatever the
number of spans or tenants (a GPU pass of small LoRA matmuls is bound by kernel launches), peft's own maths
token by token (the input cast to the adapter's dtype, scaling after B), so a tenant's log-probs and
gradients are those it gets training alone. No per-token gather of weight matrices (an (N, r, d) tensor);
the base runs once for everyone. `bench_trainer --lora-kernels` measures it against the former per-span loop.

Why the update is identical to training alone: the pass's loss is the sum of the tenants' losses, each
normalised by its own step's sample count; the tenants' parameters are disjoint, so each adapter's gradient
is the gradient of its own loss (packing keeps samples from attending to each other); clipping and the AdamW
step then run per tenant. tests/trainer/test_multitenant.py checks it for tenants A, B, C.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from workers.trainer import resident as resident_models
from workers.trainer.backend import OnStep, TrainConfig, TrainResult, TrainSample
from workers.trainer.batching import collate_packed, token_budget_groups
from workers.trainer.forward import (
    ModelLoader,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    response_stats,
)
from workers.trainer.local import LocalBackend
from workers.trainer.local_update import StepTotals
from workers.trainer.lora_spans import Span, segment_lora
from workers.trainer.losses import Sampler

# ------------------------------------------------------------------------------------------ the pass


@dataclass
class TenantJob:
    key: str  # who this is (a run id), for reports
    config: TrainConfig
    workdir: str
    samples: list[TrainSample]
    parent_adapter_dir: str | None = None
    on_step: OnStep | None = None


@dataclass
class TenantOutcome:
    key: str
    backend: LocalBackend
    result: TrainResult | None = None
    error: str | None = None
    exception: BaseException | None = None
    steps: list[int] = field(default_factory=list)


class MultiTenantPass:
    """Train several tenants' batches in shared forward/backward passes over one base model.

        with MultiTenantPass(base_model, jobs) as mt:
            outcomes = mt.train()
            outcomes[i].backend.export_adapter(out_dir)

    All jobs must run on the same device and dtype (the scheduler only groups such jobs). A job whose start
    or step callback fails is dropped from the pass with its error; the others continue.
    """

    def __init__(
        self,
        base_model: str,
        jobs: list[TenantJob],
        *,
        model_loader: ModelLoader = load_pretrained,
        resident: bool = True,
        micro_batch_tokens: int | None = None,
        lora_kernel: str = "grouped",
    ):
        """lora_kernel: how each layer applies the tenants' adapters (workers/trainer/lora_spans.py); the
        benchmark also runs the "per_span" reference."""
        if not jobs:
            raise ValueError("a multi-tenant pass needs at least one job")
        devices = {(j.config.device, j.config.dtype) for j in jobs}
        if len(devices) > 1:
            raise ValueError(f"the jobs of one pass must share device and dtype, got {sorted(devices)}")
        self.base_model = str(base_model)
        self.jobs = jobs
        self.model_loader = model_loader
        self.resident = resident
        self.lora_kernel = lora_kernel
        first = jobs[0].config
        self.micro_batch_tokens = micro_batch_tokens or first.micro_batch_tokens or 8192
        self.pack_row_tokens = first.pack_row_tokens
        self.device = resolve_device(first.device)
        self.dtype = resolve_dtype(first.dtype, self.device)
        self._lease: resident_models.Resident | None = None
        self.model: Any = None
        self.outcomes: list[TenantOutcome] = []

    def __enter__(self) -> MultiTenantPass:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        started = time.monotonic()
        if self.resident:
            self._lease = resident_models.acquire(
                self.base_model, self.dtype, self.device, self.model_loader, runs=len(self.jobs)
            )
            base, tokenizer = self._lease.model, self._lease.tokenizer
        else:
            base, tokenizer = self.model_loader(self.base_model, self.dtype, self.device)
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
        runtime = {
            "resident": resident_models.stats() if self.resident else None,
            "base_seconds": round(time.monotonic() - started, 3),
            "pass_tenants": len(self.jobs),
        }
        model = base
        for i, job in enumerate(self.jobs):
            backend = LocalBackend(self.model_loader)
            backend.adapter, backend.shared, backend.tokenizer = f"t{i}", True, tokenizer
            backend._setup(self.base_model, job.config, job.workdir)
            if i == 0:
                backend._set_checkpointing(base)
            backend.runtime = dict(runtime)
            backend._attach(model, job.parent_adapter_dir)
            model = backend.model
            self.outcomes.append(TenantOutcome(job.key, backend))
        self.model = model
        for outcome, job in zip(self.outcomes, self.jobs, strict=True):
            backend = outcome.backend
            backend.model = model
            # Adding an adapter makes peft mark only the newest one trainable: every tenant's is.
            for p in backend.params:
                p.requires_grad_(True)
            backend._begin_run(job.parent_adapter_dir)

    def train(self) -> list[TenantOutcome]:
        live: list[tuple[TenantOutcome, TenantJob]] = []
        for outcome, job in zip(self.outcomes, self.jobs, strict=True):
            done = self._guard(outcome, lambda b=outcome.backend, j=job: b.begin_train(j.samples))
            if isinstance(done, TrainResult):
                outcome.result = done
            elif outcome.error is None:
                live.append((outcome, job))
        while True:
            live = [(o, j) for o, j in live if o.error is None and o.backend.pending_steps()]
            if not live:
                break
            self._joint_step(live)
        for outcome, _ in zip(self.outcomes, self.jobs, strict=True):
            if outcome.error is None and outcome.result is None:
                outcome.result = outcome.backend.end_train()
        return self.outcomes

    def _guard(self, outcome: TenantOutcome, call):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - one tenant's failure must not sink the others' updates
            outcome.error, outcome.exception = f"{type(exc).__name__}: {exc}", exc
            return None

    def _joint_step(self, live: list[tuple[TenantOutcome, TenantJob]]) -> None:
        started = time.monotonic()
        self.model.train()
        steps = {id(o): o.backend.next_step_samples() for o, _ in live}
        totals = {id(o): StepTotals() for o, _ in live}
        items = [(o, s) for o, _ in live for s in steps[id(o)]]  # tenant after tenant: contiguous spans
        for outcome, _ in live:
            outcome.backend.zero_grad()
            for p in outcome.backend.params:  # peft's disable_adapter() (the teachers) unmarks all but one
                p.requires_grad_(True)
        lengths = [o.backend._length(s) for o, s in items]
        for group in token_budget_groups(lengths, self.micro_batch_tokens):
            chunk = [items[i] for i in group]
            sequences = []
            for outcome, sample in chunk:
                entry = outcome.backend.entry(sample)
                sequences.append((entry["prompt_ids"], entry["response_ids"]))
            pad = chunk[0][0].backend.tokenizer.pad_token_id
            batch = collate_packed(sequences, pad_id=pad, row_tokens=self.pack_row_tokens).to(self.device)
            spans: list[Span] = [(o.backend.adapter, start, end)
                     for (o, _), (start, end) in zip(chunk, batch.sample_spans(), strict=True)]
            samplers = [o.backend.entry(sample)["sampler"] for o, sample in chunk]
            with segment_lora(self.model, spans, kernel=self.lora_kernel):
                stats = response_stats(self.model, batch, sampler=Sampler.of(samplers, self.device))
                loss: torch.Tensor | None = None
                for outcome, _ in live:
                    rows = [i for i, (o, _) in enumerate(chunk) if o is outcome]
                    if not rows:
                        continue
                    part = outcome.backend.micro_batch_loss(
                        [chunk[i][1] for i in rows],
                        stats.logp[rows],
                        stats.entropy[rows],
                        batch.mask[rows],
                        len(steps[id(outcome)]),
                        totals[id(outcome)],
                    )
                    loss = part if loss is None else loss + part
                assert loss is not None  # every chunk holds samples of live tenants
                loss.backward()
        for outcome, job in live:
            backend = outcome.backend
            metrics = backend.apply_step(steps[id(outcome)], totals[id(outcome)], started)
            self._guard(outcome, lambda b=backend, m=metrics, j=job: b.finish_step(m, j.on_step))
            outcome.steps.append(metrics.step)

    def close(self) -> None:
        model = self.model
        for outcome in self.outcomes:
            outcome.backend.close()  # a shared backend holds no lease: this only drops its references
        self.model = None
        lease, self._lease = self._lease, None
        if lease is not None:
            resident_models.release(lease, model)
        else:
            del model
            resident_models.free_memory()
