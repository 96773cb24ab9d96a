"""Per-span LoRA: a forward through a peft model carrying several named adapters, with each span of the
flattened (rows x length) tokens going through its own adapter (workers/trainer/multitenant.py says why;
LocalBackend.policy() uses it for a tenant inside a pass).

Grouped (the default): a fixed handful of kernels per layer whatever the number of spans and tenants. The
adapters' A and B matrices are stacked, (G, r, d_in) and (G, d_out, r); the tokens are gathered into blocks
of one size, each block holding one span's tokens (the last block of a span padded with repeats), and
each block is multiplied by its own adapter's matrices in one batched matmul pair (torch.bmm over the
blocks, with the blocks' A and B picked by index: a grouped GEMM in plain torch); the real rows go back to
their tokens with one index_copy, padding and the base-alone tokens get no delta. FLOPs are LoRA's own plus
the padding: at most block - 1 tokens per span, where the block is the spans' mean length within
[MIN_BLOCK_TOKENS, MAX_BLOCK_TOKENS], so never more padded tokens than real ones, and few where spans are
samples of hundreds of tokens. Memory adds a copy of the layer's input in blocks and the
blocks' picked weights (blocks x r x (d_in + d_out)). This is peft's maths token by token (float64 equal to
~1e-15): the same matmuls, the input cast to the adapter's dtype and scaling after B as peft's Linear.
Adapters of different ranks cannot stack: one group per rank (a pass rarely has more than one).

Per span (kernel="per_span"): the former implementation, one matmul pair per (layer, span) in a Python loop,
so the kernel count grows with the spans; kept as the reference that tests and
`bench_trainer --lora-kernels` compare the grouped one with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

Span = tuple[str | None, int, int | None]  # (adapter name or None for the base alone, first token, end)
KERNELS = ("grouped", "per_span")


def _lora_layers(model: Any) -> list[Any]:
    from peft.tuners.lora import Linear as LoraLinear

    from workers.trainer.checkpoint import lora_modules

    return [m for _, m in lora_modules(model) if isinstance(m, LoraLinear)]


# ------------------------------------------------------------------------------------------ grouped

MIN_BLOCK_TOKENS, MAX_BLOCK_TOKENS = 16, 128


@dataclass
class _Blocks:
    """Some adapters' (of one rank) tokens of a layer in blocks of `size` tokens, each block one adapter's."""

    size: int
    slot: torch.Tensor  # (blocks,) the adapter of each block, an index into the group
    gather: torch.Tensor  # (blocks * size,) the token at each block position (padding: a repeat)
    real: torch.Tensor  # positions of `gather` that are not padding
    tokens: torch.Tensor  # the token at each of those positions
    scale: torch.Tensor  # (blocks, 1, 1) the block's adapter's alpha / r
    dropout: torch.Tensor | None  # (blocks, 1, 1) its dropout rate; None when all are 0


def _plan_blocks(spans: list[Span], group: list[str], module: Any, total: int, device, dtype) -> _Blocks:
    ranges = [(name, start, total if end is None else end) for name, start, end in spans if name in group]
    mean = sum(stop - start for _, start, stop in ranges) // max(len(ranges), 1)
    size = min(MAX_BLOCK_TOKENS, max(MIN_BLOCK_TOKENS, mean))
    slot: list[int] = []
    gather: list[int] = []
    real: list[int] = []
    tokens: list[int] = []
    for name, start, stop in ranges:
        for first in range(start, stop, size):
            last = min(first + size, stop)
            at = len(gather)
            slot.append(group.index(name))
            gather += list(range(first, last)) + [first] * (size - (last - first))
            real += range(at, at + last - first)
            tokens += range(first, last)
    scalings = [float(module.scaling[group[i]]) for i in slot]
    drops = [float(getattr(module.lora_dropout[group[i]], "p", 0.0)) for i in slot]

    def tensor(values: list, kind: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=kind, device=device)

    return _Blocks(
        size,
        tensor(slot), tensor(gather), tensor(real), tensor(tokens), tensor(scalings, dtype)[:, None, None],
        tensor(drops, dtype)[:, None, None] if any(drops) else None,
    )


class _GroupedRouting:
    """The block plans of a forward, made once (the backward's recompute reuses them) and shared by every
    layer with the same adapters."""

    def __init__(self, spans: list[Span]):
        self.spans = spans
        self.order = list(dict.fromkeys(name for name, _, _ in spans if name is not None))
        self._plans: dict[tuple, _Blocks] = {}

    def plan(self, module: Any, group: list[str], total: int, device, dtype) -> _Blocks:
        key = (tuple(group), tuple(float(module.scaling[n]) for n in group), total, device, dtype)
        if key not in self._plans:
            self._plans[key] = _plan_blocks(self.spans, group, module, total, device, dtype)
        return self._plans[key]


def _add_grouped_deltas(module: Any, args: tuple, output: torch.Tensor, *, routing: _GroupedRouting):
    names = [n for n in routing.order if n in module.lora_A]
    if not names:
        return output
    x = args[0]
    flat = x.reshape(-1, x.shape[-1])
    by_rank: dict[int, list[str]] = {}
    for name in names:  # stacked weights need one shape: one group per rank (usually a single one)
        by_rank.setdefault(module.lora_A[name].weight.shape[0], []).append(name)
    delta = None
    for group in by_rank.values():
        weight_a = torch.stack([module.lora_A[n].weight for n in group])  # (G, r, d_in)
        weight_b = torch.stack([module.lora_B[n].weight for n in group])  # (G, d_out, r)
        dtype = weight_a.dtype
        plan = routing.plan(module, group, flat.shape[0], flat.device, dtype)
        blocks = plan.slot.shape[0]
        part = flat.to(dtype).index_select(0, plan.gather).view(blocks, plan.size, -1)
        if plan.dropout is not None and module.training:
            # Each block dropped at its own adapter's rate (peft's nn.Dropout per adapter, in one draw).
            part = part * (torch.rand_like(part) >= plan.dropout) / (1 - plan.dropout)
        if len(group) == 1:  # one adapter: a broadcast view, no per-block copy of its weights
            a, b = weight_a.expand(blocks, -1, -1), weight_b.expand(blocks, -1, -1)
        else:
            a, b = weight_a.index_select(0, plan.slot), weight_b.index_select(0, plan.slot)
        out = torch.bmm(torch.bmm(part, a.transpose(1, 2)), b.transpose(1, 2)) * plan.scale
        rows = out.reshape(-1, out.shape[-1]).index_select(0, plan.real)
        if delta is None:
            delta = rows.new_zeros((flat.shape[0], rows.shape[-1]))
        delta = delta.index_copy(0, plan.tokens, rows)
    assert delta is not None  # `names` is not empty, so one group ran
    # As peft: the base output promoted to the adapter's dtype, the delta added, then back.
    return (output.to(delta.dtype) + delta.reshape(output.shape)).to(output.dtype)


# ------------------------------------------------------------------------------------------ per span


def _add_span_deltas(module: Any, args: tuple, output: torch.Tensor, *, spans: list[Span]) -> torch.Tensor:
    x = args[0]
    flat = x.reshape(-1, x.shape[-1])
    total = flat.shape[0]
    pieces: list[tuple[int, int, torch.Tensor]] = []
    for name, start, end in spans:
        if name is None or name not in module.lora_A:
            continue
        lora_a, lora_b = module.lora_A[name], module.lora_B[name]
        part = flat[start : total if end is None else end].to(lora_a.weight.dtype)
        delta = lora_b(lora_a(module.lora_dropout[name](part))) * module.scaling[name]
        pieces.append((start, start + part.shape[0], delta))
    if not pieces:
        return output
    dtype = pieces[0][2].dtype
    filled, at = [], 0
    for start, end, piece in pieces:  # spans are sorted; gaps (padding, the base alone) get no delta
        if start > at:
            filled.append(flat.new_zeros((start - at, output.shape[-1]), dtype=dtype))
        filled.append(piece)
        at = end
    if at < total:
        filled.append(flat.new_zeros((total - at, output.shape[-1]), dtype=dtype))
    delta = torch.cat(filled).reshape(output.shape)
    return (output.to(dtype) + delta).to(output.dtype)


def merge_spans(spans: list[Span]) -> list[Span]:
    """Sorted, with neighbouring spans of one adapter joined (what lies between two spans is row padding,
    whose outputs nothing reads): one matmul pair per tenant and row block instead of one per sample."""
    merged: list[Span] = []
    for name, start, end in sorted(spans, key=lambda s: s[1]):
        if merged and merged[-1][0] == name and merged[-1][2] is not None:
            merged[-1] = (name, merged[-1][1], end)
        else:
            merged.append((name, start, end))
    return merged


@contextlib.contextmanager
def segment_lora(model: Any, spans: list[Span], *, kernel: str = "grouped") -> Iterator[None]:
    """Forward (and backward: activation checkpointing recomputes inside it) with peft's own adapter
    dispatch off and each span of the flattened (rows x length) tokens through its named adapter."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: one of {', '.join(KERNELS)}")
    spans = merge_spans(spans)
    if kernel == "grouped":
        hook = partial(_add_grouped_deltas, routing=_GroupedRouting(spans))
    else:
        hook = partial(_add_span_deltas, spans=spans)
    layers = _lora_layers(model)
    # Not peft's disable_adapter(): that also switches requires_grad off on every adapter but the active one.
    before = [layer._disable_adapters for layer in layers]
    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        for layer in layers:
            layer._disable_adapters = True
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer, value in zip(layers, before, strict=True):
            layer._disable_adapters = value
