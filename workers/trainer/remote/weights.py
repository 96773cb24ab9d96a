"""Trained weights out of a Tinker-style service: the PEFT directory vLLM loads, and the marker that lets the
next run continue from the service's own state."""

from __future__ import annotations

import json
from pathlib import Path

from workers.trainer.remote.errors import RemoteTrainingError

REMOTE_FILE = "remote.json"  # in an exported adapter: where its weights live remotely (to continue training)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def parent_state_path(parent_adapter_dir: str | None, backend: str) -> str | None:
    """The service's state of the parent version (to continue its optimisation), when the parent was
    trained by ``backend``."""
    if not parent_adapter_dir:
        return None
    marker = Path(parent_adapter_dir) / REMOTE_FILE
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    return data.get("state_path") if data.get("backend") == backend else None


def to_peft_adapter(src: Path, out: Path, *, base_model: str) -> Path:
    """Turn downloaded LoRA files into the PEFT directory vLLM loads: adapter_config.json (base model set to
    ours, PEFT's required fields present) + adapter_model.safetensors with PEFT's key names."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = {p.name: p for p in src.rglob("*") if p.is_file()}
    missing = [name for name in ADAPTER_FILES if name not in files]
    if missing:
        raise RemoteTrainingError(
            f"downloaded weights are not a LoRA adapter: missing {', '.join(missing)} (got {sorted(files)})",
            backend="remote",
        )
    config = json.loads(files["adapter_config.json"].read_text())
    if config.get("peft_type", "LORA").upper() != "LORA" or not config.get("r"):
        raise RemoteTrainingError(f"unsupported adapter config: {config.get('peft_type')}", backend="remote")
    config.update(peft_type="LORA", base_model_name_or_path=base_model)
    config.setdefault("task_type", "CAUSAL_LM")
    config.setdefault("lora_alpha", config["r"])
    tensors = {}
    with safe_open(str(files["adapter_model.safetensors"]), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
            name = key if key.startswith("base_model.model.") else f"base_model.model.{key}"
            # PEFT's saved names drop the adapter name (".lora_A.default.weight" -> ".lora_A.weight").
            tensors[name.replace(".default.weight", ".weight")] = handle.get_tensor(key).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out
