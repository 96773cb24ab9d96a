"""Cost of one LoRA layer of a multi-tenant pass vs the number of tenants and spans, per-span vs grouped.

    python manage.py bench_trainer --lora-kernels --tenants 1,8,32

One peft LoRA linear layer (d_in x d_out, rank r per tenant) carrying N tenants' adapters, fed a micro-batch
of `tokens` tokens cut into each of `spans_per_tenant` spans per tenant, dealt round-robin so that no two
spans of a tenant are neighbours (more spans than a pass makes: it packs tenant after tenant, so its
micro-batches hold about one span per tenant and row). For each implementation of
workers/trainer/lora_spans.py, measured alternately in this one run:

  ops_per_layer:  the leaf aten ops of one forward + backward through the layer (torch.profiler), views and
                  allocations left out: on a GPU each is about one kernel launch, which is what bounds a pass
                  of small LoRA matmuls (launch-bound), and what the per-span loop multiplies by the spans.
                  The grouped layer's count is the same for any number of spans and tenants;
  ms_per_layer:   the median wall time of a forward + backward on this machine's CPU (noisy: compare the two
                  rows of one run, not runs).

The base layer's own matmul is in both; "base_only" is the layer with every token through the base alone.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch

from workers.trainer.lora_spans import segment_lora

# Ops that launch no kernel (metadata only) or only allocate.
NO_KERNEL = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose", "aten::slice",
    "aten::select", "aten::as_strided", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::detach",
    "aten::alias", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resolve_conj",
    "aten::resolve_neg", "aten::permute", "aten::_unsafe_view", "aten::lift_fresh", "aten::result_type",
    "aten::split", "aten::split_with_sizes", "aten::narrow", "aten::unbind", "aten::set_", "aten::to",
    "aten::_to_copy", "aten::numpy_T",
}


class _OneLayer(torch.nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.proj = torch.nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def lora_layer(tenants: int, *, d_in: int, d_out: int, rank: int, seed: int = 0) -> Any:
    """A peft model of one linear layer with `tenants` trainable adapters t0, t1, ... (B non-zero, so the
    deltas and their gradients are real work)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["proj"])
    model = get_peft_model(_OneLayer(d_in, d_out), config, adapter_name="t0")
    for t in range(1, tenants):
        model.add_adapter(f"t{t}", config)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    return model


def round_robin_spans(tenants: int, spans_per_tenant: int, tokens: int) -> list[tuple[str, int, int]]:
    pieces = tenants * spans_per_tenant
    width = tokens // pieces
    return [(f"t{i % tenants}", i * width, (i + 1) * width) for i in range(pieces)]


def _step(model: Any, x: torch.Tensor, spans: list, kernel: str | None) -> None:
    model.zero_grad(set_to_none=True)  # as the optimizer leaves them: the gradients are stored, not added
    if kernel is None:  # the base alone
        with segment_lora(model, [(None, 0, None)]):
            out = model(x)
    else:
        with segment_lora(model, spans, kernel=kernel):
            out = model(x)
    out.float().square().mean().backward()


def kernel_ops(model: Any, x: torch.Tensor, spans: list, kernel: str | None) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, x, spans, kernel)
    return sum(_kernels(e) for e in prof.events() if e.cpu_parent is None)


def _kernels(event: Any) -> int:
    """Kernels under a profiler event: its children's, or itself when none of them does work (aten::mm
    calls only metadata ops, aten::linear calls aten::mm)."""
    inner = sum(_kernels(child) for child in event.cpu_children)
    if inner:
        return inner
    return int(event.name.startswith("aten::") and event.name not in NO_KERNEL)


def bench_lora_kernels(
    *,
    tenants: tuple[int, ...] = (1, 8, 32),
    spans_per_tenant: tuple[int, ...] = (1, 4),
    tokens: int = 4096,
    d_in: int = 1024,
    d_out: int = 1024,
    rank: int = 16,
    repeats: int = 7,
    dtype: torch.dtype = torch.float32,
    log=print,
) -> list[dict[str, Any]]:
    rows = []
    for n, per_tenant in [(n, s) for n in tenants for s in spans_per_tenant]:
        model = lora_layer(n, d_in=d_in, d_out=d_out, rank=rank).to(dtype)
        spans = round_robin_spans(n, per_tenant, tokens)
        x = torch.randn(len(spans) * (tokens // len(spans)), d_in, dtype=dtype, requires_grad=True)
        kernels: list[str | None] = ["per_span", "grouped", None]
        for kernel in kernels:
            _step(model, x, spans, kernel)  # warm-up
        seconds: dict[str | None, list[float]] = {k: [] for k in kernels}
        for _ in range(repeats):  # alternating, so that the machine's load hits all three alike
            for kernel in kernels:
                started = time.perf_counter()
                _step(model, x, spans, kernel)
                seconds[kernel].append(time.perf_counter() - started)
        ops = {k: kernel_ops(model, x, spans, k) for k in kernels}
        ms = {k: statistics.median(v) * 1e3 for k, v in seconds.items()}
        row = {
            "tenants": n, "spans": len(spans), "tokens": x.shape[0], "d_in": d_in, "d_out": d_out,
            "rank": rank, "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "ops_per_layer": {"per_span": ops["per_span"], "grouped": ops["grouped"], "base_only": ops[None]},
            "ms_per_layer": {"per_span": round(ms["per_span"], 3), "grouped": round(ms["grouped"], 3),
                             "base_only": round(ms[None], 3)},
            "ops_ratio_per_span_over_grouped": round(ops["per_span"] / ops["grouped"], 2),
            "time_ratio_per_span_over_grouped": round(ms["per_span"] / ms["grouped"], 2),
        }
        log(json.dumps(row))
        rows.append(row)
    return rows
