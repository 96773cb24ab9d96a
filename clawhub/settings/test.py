"""Test settings: real PostgreSQL and Redis on this machine (``./dev test`` makes sure both answer)."""

import os
import tempfile

from clawhub.settings.test_isolation import use_test_slot
from workers import base_models

# Several test runs may share this machine (and CI runs one): each run claims a slot of its own, so two runs
# never share a database (pytest-django drops the test database when a run ends) nor a Redis database (a
# Celery worker of one run would take the other run's tasks); each pytest-xdist worker claims its own.
# Subprocesses inherit their test process's choice.
use_test_slot()

# Tests serve and train the tiny model (workers/base_models.py), whatever the embedded default is; the
# real-model tests name theirs. Set before the settings read it, so every default derived from it (the
# upstream's and the judge's model name, the judge's temperature) is the tiny model's, in subprocesses too.
os.environ.setdefault("CLAWHUB_BASE_MODEL", str(base_models.TINY_MODEL_DIR))

from .base import *  # noqa: E402,F403
from .base import BASE_DIR  # noqa: E402

PASSWORD_HASHERS = [
    # Argon2 stays the default in every other environment; tests create many users.
    "django.contrib.auth.hashers.MD5PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
TEST_OUTPUT_DIR = BASE_DIR / "test-output"
# The capture consumer runs as a thread of each test gateway, on a stream and spool folder of its own.
CAPTURE_CONSUMER_IN_PROCESS = True
CAPTURE_SPOOL_DIR = os.path.join(tempfile.gettempdir(), f"clawhub-test-capture-{os.getpid()}")
# Tests wait for their turns to be stored: a short linger keeps those waits short.
CAPTURE_BATCH_LINGER_MS = 100
# The per-tenant training budget (clawhub/training/budget.py) is off here: tests start many runs of one tenant
# within seconds. tests/security/test_training_limits.py turns it on.
CLAWHUB_TRAIN_BUDGET_GPU_SECONDS_PER_DAY = 0
CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR = 0
# New keys get no default /v1 limits here: tests send many requests through one key. tests/keys turns them on.
KEY_DEFAULT_RPM_LIMIT = KEY_DEFAULT_TPM_LIMIT = KEY_DEFAULT_CONCURRENCY_LIMIT = None
