"""The training backends' one registry (workers.trainer.registry) as the Django side reads it."""

import subprocess
import sys
from pathlib import Path

from clawhub.training.models import Backend, TrainingRun, TrainingSettings
from workers.trainer.registry import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


def test_the_backend_choices_are_the_registry():
    assert Backend.values == list(BACKENDS)
    for model in (TrainingRun, TrainingSettings):
        width = model._meta.get_field("backend").max_length
        assert all(len(name) <= width for name in BACKENDS)


def test_settings_refuse_a_training_backend_that_is_not_registered():
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "clawhub.settings.base",
           "CLAWHUB_TRAIN_BACKEND": "x", "CLAWHUB_DATA_DIR": "/tmp/clawhub-train-backend-check"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"CLAWHUB_TRAIN_BACKEND='x': use one of {', '.join(BACKENDS)}" in result.stderr


def test_the_train_task_builds_the_registered_backend_from_settings(settings):
    from workers.tasks.training import make_backend
    from workers.trainer.remote.tinker import TinkerBackend

    settings.CLAWHUB_TINKER_API_KEY, settings.CLAWHUB_TINKER_BASE_URL = "tml-test", "http://tinker.invalid"
    backend = make_backend("tinker")
    assert isinstance(backend, TinkerBackend) and backend.base_url == "http://tinker.invalid"
    assert backend.retry.attempts == max(1, settings.CLAWHUB_REMOTE_RETRY_ATTEMPTS)
