"""TrainConfig validation and the backend interface's plain-data contract."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.specs import LORA_TARGET_MODULES
from workers.trainer.backend import TrainConfig, TrainingBackend, TrainSample
from workers.trainer.registry import BACKENDS, backend_class


def test_defaults_follow_openclaw_rl():
    # 1e-4: OpenClaw-RL's LoRA learning rate (1e-5 is its full fine-tuning one).
    cfg = TrainConfig()
    assert (cfg.lr, cfg.lora_r, cfg.lora_alpha, cfg.eps_low, cfg.eps_high) == (1e-4, 16, 32, 0.2, 0.28)
    assert (cfg.w_rl, cfg.w_opd, cfg.kl_coef, cfg.topk_overlap) == (1.0, 1.0, 0.0, 4)
    assert set(cfg.target_modules) == LORA_TARGET_MODULES
    assert (cfg.dtype, cfg.device) == ("auto", "auto")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "ppo"}, "method='ppo': use one of rl, opd, combine"),
        ({"lr": 0}, "lr=0: must be in (0, 1)"),
        ({"lora_r": 0}, "lora_r=0"),
        ({"eps_low": 1.5}, "eps_low=1.5"),
        ({"w_rl": -1}, "weights must be >= 0"),
        ({"method": "combine", "w_rl": 0, "w_opd": 0}, "trains nothing"),
        ({"method": "opd", "w_opd": 0}, "set w_opd > 0"),
        ({"kl_coef": -0.1}, "kl_coef=-0.1"),
        ({"micro_batch_size": 0}, "micro_batch_size=0"),
        ({"grad_accum": 0}, "or None for one optimizer step per batch"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"max_seq_len": 8}, "max_seq_len=8"),
        ({"dtype": "fp8"}, "dtype='fp8': use one of auto, float32, bfloat16, float16"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"target_modules": ()}, "target_modules must name at least one module"),
        ({"padding_side": "middle"}, "padding_side='middle'"),
    ],
)
def test_bad_values_are_rejected_with_an_actionable_message(kwargs, message):
    with pytest.raises(ValueError, match="invalid TrainConfig") as excinfo:
        TrainConfig(**kwargs)
    assert message in str(excinfo.value)


def test_all_problems_are_reported_at_once():
    with pytest.raises(ValueError) as excinfo:
        TrainConfig(lr=5, micro_batch_size=0)
    assert "lr=5" in str(excinfo.value) and "micro_batch_size=0" in str(excinfo.value)


def test_round_trips_through_json_and_rejects_unknown_keys():
    cfg = TrainConfig(method="rl", lr=3e-5, grad_accum=2, target_modules=("q_proj",))
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown TrainConfig field\(s\) \['learning_rate'\]"):
        TrainConfig.from_dict({"learning_rate": 1e-4})


def test_samples_per_step():
    assert TrainConfig().samples_per_step is None
    assert TrainConfig(micro_batch_size=2, grad_accum=3).samples_per_step == 6


def test_sample_validation():
    with pytest.raises(ValueError, match="reward must be -1, 0 or \\+1"):
        TrainSample(sample_id=1, messages=[{"role": "user", "content": "x"}], response_text="y", reward=2)
    with pytest.raises(ValueError, match="messages"):
        TrainSample(sample_id=1, messages=[], response_text="y")
    prompt = [{"role": "user", "content": "x"}]
    for weight in (-0.5, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
            TrainSample(sample_id=1, messages=prompt, response_text="y", weight=weight)
    assert TrainSample(sample_id=1, messages=prompt, response_text="y").weight == 1.0


def test_backend_registry():
    from workers.trainer.local import LocalBackend

    assert backend_class("local") is LocalBackend and issubclass(LocalBackend, TrainingBackend)
    assert BACKENDS["local"] == "workers.trainer.local:LocalBackend"
    with pytest.raises(ValueError, match="unknown training backend 'nope'"):
        backend_class("nope")


def test_every_registered_backend_is_the_class_of_its_name_and_builds_from_settings():
    from types import SimpleNamespace

    from workers.trainer.registry import backend_from_config, backend_names

    config = SimpleNamespace(
        CLAWHUB_TINKER_API_KEY="tml-k", CLAWHUB_TINKER_BASE_URL="", CLAWHUB_TINKER_BASE_MODEL="m",
        CLAWHUB_FIREWORKS_API_KEY="fw-k", CLAWHUB_FIREWORKS_ACCOUNT_ID="acct", CLAWHUB_FIREWORKS_BASE_URL="",
        CLAWHUB_FIREWORKS_BASE_MODEL="", CLAWHUB_REMOTE_RETRY_ATTEMPTS=0, CLAWHUB_REMOTE_RETRY_BACKOFF=1.5,
        CLAWHUB_REMOTE_CALL_TIMEOUT=9.0,
    )
    assert backend_names() == ["local", "tinker", "fireworks"]
    for name in backend_names():
        backend = backend_from_config(name, config)
        assert type(backend) is backend_class(name) and backend.name == name
    assert backend_from_config("local", config).resident  # the train worker keeps its base model loaded
    tinker = backend_from_config("tinker", config)
    assert (tinker.base_url, tinker.remote_base_model) == (None, "m")
    assert (tinker.retry.attempts, tinker.retry.backoff_s, tinker.retry.call_timeout_s) == (1, 1.5, 9.0)
    assert backend_from_config("fireworks", config).account_id == "acct"


def test_the_interface_imports_neither_torch_nor_django():
    # The web process builds samples and configs; it must never pull torch in.
    code = (
        "import sys, workers.trainer.backend, workers.trainer.registry; "
        "bad = [m for m in ('torch', 'transformers', 'peft', 'django') if m in sys.modules]; "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
