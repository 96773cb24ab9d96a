"""Production settings: secrets and hosts come from the environment and have no defaults."""

import os
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

for _name in ("DJANGO_SECRET_KEY", "DATABASE_URL", "DJANGO_ALLOWED_HOSTS"):
    if not os.environ.get(_name):
        raise ImproperlyConfigured(f"{_name} must be set in production")

# Shipped examples are not secrets: refuse to start on one, or on a secret short enough to guess.
_PLACEHOLDERS = ("change-me", "changeme", "example", "embedded-default", "not-for-production", "secret-key")


def _refuse_weak(name: str, value: str, *, min_length: int) -> None:
    if any(p in value.lower() for p in _PLACEHOLDERS):
        raise ImproperlyConfigured(f"{name} is a placeholder from the examples; set a random value "
                                   f"(python -c 'import secrets; print(secrets.token_urlsafe(50))')")
    if len(value) < min_length or len(set(value)) < 8:
        raise ImproperlyConfigured(f"{name} must be a random string of at least {min_length} characters")


_refuse_weak("DJANGO_SECRET_KEY", os.environ["DJANGO_SECRET_KEY"], min_length=50)
if os.environ.get("METRICS_TOKEN"):
    _refuse_weak("METRICS_TOKEN", os.environ["METRICS_TOKEN"], min_length=24)
_db_password = urlsplit(os.environ["DATABASE_URL"]).password
if _db_password:
    _refuse_weak("the DATABASE_URL password", unquote(_db_password), min_length=12)

from clawhub.core.logging import build_logging  # noqa: E402

from .base import *  # noqa: E402,F403
from .base import BASE_DIR, env  # noqa: E402

DEBUG = False
# A deployment proves each new account's mailbox before it can log in (off in the embedded default, which
# may have no mail server). Sign-up answers every address alike either way; verification also stops an
# account made in someone else's name from being used before its mailbox's owner sees it.
ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = env.bool("CLAWHUB_REQUIRE_EMAIL_VERIFICATION", default=True)
if not env.str("EMAIL_URL", default=""):
    # Never the embedded default's local mailbox, whose reader is whoever signed up with an address: that
    # would let anyone read the verification and invitation mails of an address they do not own.
    EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env.bool("CLAWHUB_SECURE_COOKIES", default=True)
CSRF_COOKIE_SECURE = env.bool("CLAWHUB_SECURE_COOKIES", default=True)
# TLS is terminated by the reverse proxy; these are the operator's choice there (see README).
SECURE_SSL_REDIRECT = env.bool("CLAWHUB_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("CLAWHUB_HSTS_SECONDS", default=0)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
STATIC_ROOT = BASE_DIR / "staticfiles"  # filled by `manage.py collectstatic` in the image build
WHITENOISE_USE_FINDERS = False
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
LOGGING = build_logging(level=env.str("CLAWHUB_LOG_LEVEL", default="INFO"), json_format=True)
