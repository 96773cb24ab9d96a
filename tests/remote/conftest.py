"""Fixtures for the remote-backend contract tests: the fake services, and batches built on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.remote.fakes.tinker_server import FakeTinker, TinyLogprobs
from tests.vllm_server import TINY_MODEL_DIR
from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.remote.protocol import RetryPolicy

TINKER_KEY = "tml-clawhub-test-key"
FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.1, max_backoff_s=0.5, call_timeout_s=30)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    assert (TINY_MODEL_DIR / "model.safetensors").exists(), "run: python manage.py build_tiny_model"
    return TINY_MODEL_DIR


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def reference(tiny_dir) -> TinyLogprobs:
    """The same log-prob oracle the fakes use, for computing what the SDK should have sent."""
    return TinyLogprobs(tiny_dir)


@pytest.fixture
def fake_tinker(tiny_dir, tmp_path):
    server = FakeTinker(base_model_dir=tiny_dir, api_key=TINKER_KEY, artifacts_dir=tmp_path / "tinker-store")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_tinker(fake_tinker, tiny_dir):
    from workers.trainer.remote import backend_for

    created = []

    def make(api_key: str = TINKER_KEY, retry: RetryPolicy = FAST_RETRY):
        backend = backend_for(
            "tinker",
            api_key=api_key,
            base_url=fake_tinker.url,
            remote_base_model="tiny-qwen2",
            tokenizer=str(tiny_dir),
            retry=retry,
        )
        created.append(backend)
        return backend

    yield make
    for backend in created:
        backend.close()


def chat_sample(
    tokenizer, sample_id, user: str, answer: str, *, reward=0, hints=(), recorded=True
) -> TrainSample:
    """A turn as the gateway records it: recorded ids are the answer's tokens plus the end-of-turn token."""
    ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return TrainSample(
        sample_id=sample_id,
        messages=[{"role": "user", "content": user}],
        response_text=answer,
        response_token_ids=ids if recorded else None,
        response_logprobs=[-0.5 - 0.01 * i for i in range(len(ids))] if recorded else None,
        reward=reward,
        hints=list(hints),
    )


def small_config(**overrides) -> TrainConfig:
    return TrainConfig(**{"lr": 3e-5, "lora_r": 8, "lora_alpha": 16, "max_seq_len": 512, **overrides})


FIREWORKS_KEY = "fw-clawhub-test-key"
FIREWORKS_ACCOUNT = "clawhub-test"


@pytest.fixture
def fake_fireworks(tiny_dir, tmp_path):
    from tests.remote.fakes.fireworks_server import FakeFireworks

    server = FakeFireworks(
        base_model_dir=tiny_dir,
        api_key=FIREWORKS_KEY,
        account_id=FIREWORKS_ACCOUNT,
        artifacts_dir=tmp_path / "fireworks-store",
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_fireworks(fake_fireworks, tiny_dir):
    from workers.trainer.remote import backend_for

    created = []

    def make(api_key: str = FIREWORKS_KEY, retry: RetryPolicy = FAST_RETRY):
        backend = backend_for(
            "fireworks",
            api_key=api_key,
            account_id=FIREWORKS_ACCOUNT,
            base_url=fake_fireworks.url,
            remote_base_model="accounts/fireworks/models/tiny-qwen2",
            tokenizer=str(tiny_dir),
            retry=retry,
        )
        created.append(backend)
        return backend

    yield make
    for backend in created:
        backend.close()
