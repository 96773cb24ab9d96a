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


def save_checkpoint(
    workdir: Path,
    *,
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    prepared: dict[str, Any] | None,
) -> Path:
    root = checkpoints_dir(workdir)
    root.mkdir(parents=True, exist_ok=True)
    name = _step_name(step)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "adapter", safe_serialization=True)
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
