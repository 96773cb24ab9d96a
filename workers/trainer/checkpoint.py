"""Crash-safe checkpoints in a run's workdir.

Layout:  workdir/checkpoints/step-00000003/{adapter/, optimizer.pt, rng.pt, prepared.pt, state.json}
         workdir/checkpoints/latest        -> "step-00000003"

A checkpoint is written into a hidden temp directory and renamed into place only when complete, then `latest`
is replaced atomically; a process killed at any instant leaves the previous complete checkpoint readable, and
the leftovers (temp dirs, older steps) are swept on the next save.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.json"


def checkpoints_dir(workdir: Path) -> Path:
    return workdir / "checkpoints"


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def latest_checkpoint(workdir: Path) -> Path | None:
    root = checkpoints_dir(workdir)
    pointer = root / "latest"
    if pointer.exists():
        candidate = root / pointer.read_text().strip()
        if (candidate / STATE_FILE).exists():
            return candidate
    # `latest` is written after the rename, so a crash in between leaves a newer complete step without it.
    complete = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).exists()) if root.exists() else []
    return complete[-1] if complete else None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def lora_modules(model: Any) -> list[tuple[str, Any]]:
    """(qualified name, layer) of every peft LoRA layer, found without walking into the layers themselves:
    with N adapters attached a full named_modules()/state_dict() walk is N times longer, and a pass that saves
    each of its N adapters would pay N^2."""
    from peft.tuners.lora import LoraLayer

    found: list[tuple[str, Any]] = []

    def walk(prefix: str, module: Any) -> None:
        if isinstance(module, LoraLayer):
            found.append((prefix, module))
            return
        for name, child in module._modules.items():
            if child is not None:
                walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", model)
    return found


def adapter_state(model: Any, adapter: str) -> dict[str, torch.Tensor]:
    """One adapter's LoRA weights keyed as peft saves them (the adapter's name left out of the keys)."""
    state = {}
    for name, module in lora_modules(model):
        if adapter in module.lora_A:
            state[f"{name}.lora_A.weight"] = module.lora_A[adapter].weight
            state[f"{name}.lora_B.weight"] = module.lora_B[adapter].weight
    return state


def save_adapter(model: Any, out: Path, adapter: str = "default") -> None:
    """One adapter of a peft model as a PEFT directory at `out` (adapter_config.json +
    adapter_model.safetensors, keyed as peft's save_pretrained keys them), without the model card peft
    renders from a template at every save, and in time independent of how many adapters are attached."""
    import copy

    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in adapter_state(model, adapter).items()},
        str(out / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    config = copy.deepcopy(model.peft_config[adapter])
    config.inference_mode = True
    config.save_pretrained(str(out))


def save_checkpoint(
    workdir: Path,
    *,
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    prepared: dict[str, Any] | None,
    adapter: str = "default",
) -> Path:
    root = checkpoints_dir(workdir)
    root.mkdir(parents=True, exist_ok=True)
    name = _step_name(step)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_adapter(model, tmp / "adapter", adapter)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    torch.save(prepared, tmp / "prepared.pt")
    (tmp / STATE_FILE).write_text(json.dumps(state))
    final = root / name
    if final.exists():  # the same step written before a crash, but never pointed to: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer_tmp = root / f".latest-{os.getpid()}"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / "latest")
    for old in root.iterdir():
        if old.name not in (name, "latest"):
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    return final


def load_checkpoint(
    path: Path,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """(state, optimizer state dict, prepared batch, rng state) of a complete checkpoint directory."""
    state = json.loads((path / STATE_FILE).read_text())
    optimizer_state = torch.load(path / "optimizer.pt", weights_only=True)
    prepared = torch.load(path / "prepared.pt", weights_only=False)
    rng = torch.load(path / "rng.pt", weights_only=False)
    return state, optimizer_state, prepared, rng


# --- optimizer state that outlives a run (optimizer continuity across adapter versions) ---------------------

OPTIMIZER_FILE = "optimizer.pt"


def _trainable(model: Any, adapter: str = "default") -> list[tuple[str, torch.nn.Parameter]]:
    """One adapter's trainable parameters, named as if the adapter were called "default" (the name peft
    gives a run's only adapter), so that state saved by a run and restored in a multi-tenant pass, where
    each tenant's adapter has its own name, or the other way round, finds the same keys."""
    out = []
    for name, module in lora_modules(model):
        if adapter in module.lora_A:
            for kind in ("lora_A", "lora_B"):
                p = getattr(module, kind)[adapter].weight
                if p.requires_grad:
                    out.append((f"{name}.{kind}.default.weight", p))
    return out


def save_optimizer_state(
    state_dir: Path,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    adapter: str = "default",
    optimized: dict[int, torch.Tensor] | None = None,
) -> Path:
    """The AdamW moments and step of every trainable parameter, keyed by parameter name (not by the
    optimizer's positional index), so that the next run, which builds its own optimizer over a freshly loaded
    adapter, restores each moment onto the same LoRA matrix. Written atomically. optimized: the tensor the
    optimizer steps for a parameter (by id) where it is not the parameter (float32 masters of a bf16 one)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    trainable = _trainable(model, adapter)
    optimized = optimized or {}
    index = {id(optimized.get(id(p), p)): name for name, p in trainable}
    by_name = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p in optimizer.state and id(p) in index:
                by_name[index[id(p)]] = {k: v.detach().cpu().clone() for k, v in optimizer.state[p].items()}
    steps = max((int(s["step"]) for s in by_name.values() if "step" in s), default=0)
    shapes = {name: list(p.shape) for name, p in trainable}
    tmp = state_dir / f".{OPTIMIZER_FILE}.{os.getpid()}"
    torch.save({"format": 1, "steps": steps, "shapes": shapes, "state": by_name}, tmp)
    os.replace(tmp, state_dir / OPTIMIZER_FILE)
    return state_dir / OPTIMIZER_FILE


def restore_optimizer_state(
    state_dir: Path,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    adapter: str = "default",
    optimized: dict[int, torch.Tensor] | None = None,
) -> tuple[int | None, str]:
    """Loads what save_optimizer_state wrote onto `optimizer` (whose hyperparameters, e.g. lr, stay the new
    run's). Returns (optimizer steps the state had taken, note); (None, why) when there is nothing usable,
    and then the optimizer is left fresh: a partial restore would mix moments of two optimisations."""
    path = state_dir / OPTIMIZER_FILE
    if not path.exists():
        return None, "the parent version has no optimizer state for this backend"
    saved = torch.load(path, weights_only=True)
    params = dict(_trainable(model, adapter))
    shapes = {name: list(p.shape) for name, p in params.items()}
    if saved.get("shapes") != shapes:
        return None, "the parent's optimizer state is for differently shaped LoRA parameters"
    for name, p in params.items():
        entry = saved["state"].get(name)
        if entry is not None:
            target = (optimized or {}).get(id(p), p)
            optimizer.state[target] = {
                k: (v.to(target.device, target.dtype) if k != "step" else v.clone()) for k, v in entry.items()
            }
    return int(saved.get("steps", 0)), ""
