"""Per-span LoRA: a forward through a peft model carrying several named adapters, with each span of the
flattened (rows x length) tokens going through its own adapter, grouped per adapter inside every layer
(workers/trainer/multitenant.py says why; LocalBackend.policy() uses it for a tenant inside a pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch

Span = tuple[str | None, int, int | None]  # (adapter name or None for the base alone, first token, end)


def _lora_layers(model: Any) -> list[Any]:
    from peft.tuners.lora import Linear as LoraLinear

    from workers.trainer.checkpoint import lora_modules

    return [m for _, m in lora_modules(model) if isinstance(m, LoraLinear)]


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
    # As peft: the base output promoted to the adapter's dtype, the delta added, then back.
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
def segment_lora(model: Any, spans: list[Span]) -> Iterator[None]:
    """Forward (and backward: activation checkpointing recomputes inside it) with peft's own adapter
    dispatch off and each span of the flattened (rows x length) tokens through its named adapter."""
    spans = merge_spans(spans)
    layers = _lora_layers(model)
    # Not peft's disable_adapter(): that also switches requires_grad off on every adapter but the active one.
    before = [layer._disable_adapters for layer in layers]
    handles = [layer.register_forward_hook(partial(_add_span_deltas, spans=spans)) for layer in layers]
    try:
        for layer in layers:
            layer._disable_adapters = True
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer, value in zip(layers, before, strict=True):
            layer._disable_adapters = value
