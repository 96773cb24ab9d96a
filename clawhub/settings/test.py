"""Test settings: real PostgreSQL and Redis on this machine (``./dev test`` makes sure both answer)."""

import os
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/clawhub")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")

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
