from pathlib import Path

import pytest

from tests.vllm_server import TINY_MODEL_DIR


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The committed artifact (python manage.py build_tiny_model): what tests, CI and vLLM all load."""
    assert (TINY_MODEL_DIR / "model.safetensors").exists(), "run: python manage.py build_tiny_model"
    return TINY_MODEL_DIR


@pytest.fixture(scope="session")
def lora_adapters(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """Two random, non-zero LoRA adapters for the tiny model (seeds 1 and 2), as PEFT directories."""
    from workers.tiny_model.builder import make_lora_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_lora_adapter(tiny_model_dir, root / name, seed=seed) for name, seed in (("a", 1), ("b", 2))
    }
