"""The base model a train worker keeps loaded across runs, and the LoRA adapters it attaches and detaches.

A train worker (`--pool solo`, one per GPU) is one long-lived process. Loading a 4B base in bf16 reads ~8 GB
before any token is trained, so the process loads each base once and keeps it: a run *attaches* its tenant's
adapter to the resident weights (peft injects LoRA layers into the base's linear modules), trains, exports,
and *detaches* it (peft's unload puts the original modules back, without merging anything into them). The
OPD teacher and the KL reference are the same resident weights with the adapter disabled.

One base per process: a run on another base model (or dtype, or device) evicts the current one and loads
its own, once. A detach that cannot prove the base clean again (an adapter layer left behind by a run that
failed half-way through attaching) evicts it as well, so the next run reloads instead of training on a
contaminated model. `stats()` says what happened (loads, runs, time spent loading), and every run reports it.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

Loader = Callable[[str, torch.dtype, torch.device], tuple[Any, Any]]


@dataclass
class Resident:
    key: tuple[str, str, str, int]
    model: Any  # the bare base model (no adapter attached between runs)
    tokenizer: Any
    load_seconds: float
    runs: int = 0
    attached: int = 0  # runs or passes holding it now (0 or 1 in a solo worker)
    # The previous run's LoRA weights, weakly: None once they are freed (the run's memory is back).
    last_adapter: list[weakref.ref] = field(default_factory=list)


_lock = threading.Lock()
_current: Resident | None = None
_loads = 0
_evictions: list[str] = []


def _key(base_model: str, dtype: torch.dtype, device: torch.device, loader: Loader) -> tuple:
    # The loader is part of the key: the benchmark's random-weight loader builds a different model.
    return (str(base_model), str(dtype), str(device), id(loader))


def acquire(
    base_model: str, dtype: torch.dtype, device: torch.device, loader: Loader, *, runs: int = 1
) -> Resident:
    """The resident base for this (model, dtype, device), loaded now if it is not the current one; `runs`
    tenant updates will use it (a multi-tenant pass acquires once for all of them)."""
    with _lock:
        return _acquire_locked(base_model, dtype, device, loader, runs)


def acquire_if_idle(
    base_model: str, dtype: torch.dtype, device: torch.device, loader: Loader
) -> Resident | None:
    """acquire() for a short read-only use (the promotion gate), but only when that costs no other run
    anything: nothing is attached now, and the resident base is this one or there is none yet (never evict
    another base, e.g. a bf16 training copy, for it). None: the caller loads a private copy."""
    with _lock:
        current = _current
        busy = current is not None and (
            current.attached or current.key != _key(base_model, dtype, device, loader))
        if busy:
            return None
        return _acquire_locked(base_model, dtype, device, loader, 0)


def _acquire_locked(
    base_model: str, dtype: torch.dtype, device: torch.device, loader: Loader, runs: int
) -> Resident:
    global _current, _loads
    key = _key(base_model, dtype, device, loader)
    if _current is not None and _current.key != key:
        if _current.attached:
            raise RuntimeError(
                f"the resident base {_current.key[0]!r} still has {_current.attached} adapter(s) attached"
            )
        evict(f"base model changed to {base_model!r}")
    if _current is None:
        started = time.monotonic()
        model, tokenizer = loader(base_model, dtype, device)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        for p in model.parameters():
            p.requires_grad_(False)
        _loads += 1
        _current = Resident(key, model, tokenizer, round(time.monotonic() - started, 3))
        log.info("resident base %s loaded in %.1f s", base_model, _current.load_seconds)
    _current.attached += 1
    _current.runs += runs
    return _current


def _adapter_layers(model: Any) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def adapter_weights(peft_model: Any, adapter: str | None = None) -> list[torch.nn.Parameter]:
    """The LoRA matrices of one adapter (every adapter when None) of a peft model."""
    from workers.trainer.checkpoint import lora_modules

    params = []
    for _, module in lora_modules(peft_model):
        for name in ("lora_A", "lora_B"):
            for key, layer in getattr(module, name).items():
                if adapter is None or key == adapter:
                    params.append(layer.weight)
    return params


def release(resident: Resident, peft_model: Any | None) -> None:
    """Detach every adapter `peft_model` put on the resident base (all of a multi-tenant pass's at once) and
    free its memory. Safe after a failure anywhere in a run (peft_model None: the failure came before the
    adapter was wrapped; a half-attached layer is then found on the base and the base evicted)."""
    with _lock:
        resident.attached = max(0, resident.attached - 1)
        refs = [weakref.ref(p) for p in adapter_weights(peft_model)] if peft_model is not None else []
        try:
            if peft_model is not None:
                peft_model.unload()
        except Exception:  # noqa: BLE001 - whatever broke, the base is not trusted any more
            log.exception("unloading the adapter failed")
        base = resident.model
        if hasattr(base, "disable_input_require_grads"):
            base.disable_input_require_grads()  # peft adds this hook at every attach
        for attr in ("peft_config", "_hf_peft_config_loaded"):
            if attr in vars(base):
                delattr(base, attr)
        leftover = _adapter_layers(base)
        if leftover or any(p.requires_grad for p in base.parameters()):
            evict(f"{len(leftover)} adapter layer(s) left on the base after a detach")
        resident.last_adapter = refs
    free_memory()


def evict(reason: str) -> None:
    """Drop the resident base (the next run loads again)."""
    global _current
    if _current is not None:
        log.warning("resident base %s evicted: %s", _current.key[0], reason)
        _evictions.append(reason)
        _current = None
    free_memory()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stats() -> dict[str, Any]:
    """Loads and runs of this process's resident base, and whether the last detached adapter is freed."""
    current = _current
    return {
        "loads": _loads,
        "evictions": len(_evictions),
        "runs_on_this_load": current.runs if current else 0,
        "load_seconds": current.load_seconds if current else None,
        "previous_adapter_freed": all(ref() is None for ref in current.last_adapter) if current else True,
    }


def reset() -> None:
    """Forget everything (tests and the benchmark's 'fresh process' mode)."""
    global _loads
    evict("reset")
    _loads = 0
    _evictions.clear()
