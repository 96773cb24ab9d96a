"""Fixtures for the remote-backend contract tests: the fake services, and batches built on the tiny model."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import gateway_factory  # noqa: F401 - a fixture (a real gateway in a thread)
from tests.remote.fakes.tinker_server import FakeTinker, TinyLogprobs
from tests.training.conftest import sent  # noqa: F401 - a fixture (send_task recorded, not sent)
from workers.trainer.backend import TrainConfig, TrainSample
from workers.trainer.remote.errors import RetryPolicy

TINKER_KEY = "tml-clawhub-test-key"
FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.1, max_backoff_s=0.5, call_timeout_s=30)


@pytest.fixture(scope="session")
def reference(tiny_model_dir) -> TinyLogprobs:
    """The same log-prob oracle the fakes use, for computing what the SDK should have sent."""
    return TinyLogprobs(tiny_model_dir)


def _serving(server):
    server.start()
    yield server
    server.stop()


def _backends(name: str, default_key: str, **options):
    """Yields make(api_key=..., retry=...) -> a `name` backend with `options`; closes them all after."""
    from workers.trainer.registry import backend_for

    created = []

    def make(api_key: str = default_key, retry: RetryPolicy = FAST_RETRY):
        backend = backend_for(name, api_key=api_key, retry=retry, **options)
        created.append(backend)
        return backend

    yield make
    for backend in created:
        backend.close()


@pytest.fixture
def fake_tinker(tiny_model_dir, tmp_path):
    yield from _serving(
        FakeTinker(base_model_dir=tiny_model_dir, api_key=TINKER_KEY, artifacts_dir=tmp_path / "tinker-store")
    )


@pytest.fixture
def make_tinker(fake_tinker, tiny_model_dir):
    yield from _backends(
        "tinker", TINKER_KEY, base_url=fake_tinker.url, remote_base_model="tiny-qwen2",
        tokenizer=str(tiny_model_dir),
    )


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
        logprobs_mode="processed_logprobs" if recorded else "",
        reward=reward,
        hints=list(hints),
    )


def opd_samples(tokenizer) -> list[TrainSample]:
    """Two hinted turns (the first with two hints to choose between) and one with a score alone, which OPD
    ignores."""
    hints = ["Answer in one word.", "Mention the river Seine and the Eiffel tower in your answer."]
    return [
        chat_sample(tokenizer, 10, "Where is Paris?", "In France.", hints=hints),
        chat_sample(tokenizer, 11, "Name a colour.", "Blue.", hints=["Prefer green."]),
        chat_sample(tokenizer, 12, "No hint here.", "Fine.", reward=1),
    ]


def small_config(**overrides) -> TrainConfig:
    return TrainConfig(**{"lr": 3e-5, "lora_r": 8, "lora_alpha": 16, "max_seq_len": 512, **overrides})


FIREWORKS_KEY = "fw-clawhub-test-key"
FIREWORKS_ACCOUNT = "clawhub-test"


@pytest.fixture
def fake_fireworks(tiny_model_dir, tmp_path):
    from tests.remote.fakes.fireworks_server import FakeFireworks

    yield from _serving(FakeFireworks(
        base_model_dir=tiny_model_dir,
        api_key=FIREWORKS_KEY,
        account_id=FIREWORKS_ACCOUNT,
        artifacts_dir=tmp_path / "fireworks-store",
    ))


@pytest.fixture
def make_fireworks(fake_fireworks, tiny_model_dir):
    yield from _backends(
        "fireworks",
        FIREWORKS_KEY,
        account_id=FIREWORKS_ACCOUNT,
        base_url=fake_fireworks.url,
        remote_base_model="accounts/fireworks/models/tiny-qwen2",
        tokenizer=str(tiny_model_dir),
    )


# ---------------------------------------------------------------------------------------------- Django path


@pytest.fixture
def remote_site(settings, tmp_path, tiny_model_dir, fake_tinker, fake_fireworks):
    """Site settings that point both remote backends at their fakes, with a small retry budget; returns
    configure(backend) -> the fake that backend talks to (its credentials already in settings)."""
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")
    settings.CLAWHUB_ADAPTER_DIR = str(tmp_path / "adapters")
    settings.CLAWHUB_TRAIN_BASE_MODEL = str(tiny_model_dir)
    settings.CLAWHUB_TINKER_API_KEY = TINKER_KEY
    settings.CLAWHUB_TINKER_BASE_URL = fake_tinker.url
    settings.CLAWHUB_TINKER_BASE_MODEL = "tiny-qwen2"
    settings.CLAWHUB_FIREWORKS_API_KEY = FIREWORKS_KEY
    settings.CLAWHUB_FIREWORKS_ACCOUNT_ID = FIREWORKS_ACCOUNT
    settings.CLAWHUB_FIREWORKS_BASE_URL = fake_fireworks.url
    settings.CLAWHUB_FIREWORKS_BASE_MODEL = "accounts/fireworks/models/tiny-qwen2"
    settings.CLAWHUB_REMOTE_RETRY_ATTEMPTS = 2
    settings.CLAWHUB_REMOTE_RETRY_BACKOFF = 0.1
    settings.CLAWHUB_REMOTE_CALL_TIMEOUT = 30.0
    settings.CLAWHUB_REMOTE_RUN_RETRIES = 1
    fakes = {"tinker": fake_tinker, "fireworks": fake_fireworks}
    return fakes.__getitem__


def recorded_samples(user, tokenizer, rewards, *, tenant=None, hints=None):
    """Approved samples whose turns carry the response token ids and sampling log-probs the gateway records
    (so pi_old is the recorded one, as in production)."""
    from clawhub.review.models import Sample
    from tests.review.conftest import approved_sample

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    samples = []
    for i, reward in enumerate(rewards):
        sample = approved_sample(user, tenant=tenant, reward=reward)
        turn = sample.turn
        reply = f"Answer number {i}, in plain words."
        ids = tokenizer.encode(reply, add_special_tokens=False) + [end]
        turn.response = [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
        ]
        turn.token_ids, turn.logprobs = ids, [-0.4 - 0.01 * j for j in range(len(ids))]
        turn.sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "logprobs_mode": "processed_logprobs"}
        turn.save(update_fields=["response", "token_ids", "logprobs", "sampling"])
        if hints:
            sample.judgment.hints = list(hints)
            sample.judgment.save(update_fields=["hints"])
        samples.append(Sample.objects.get(pk=sample.pk))
    return samples
