"""A deployment requires verified addresses unless its operator turns that off; the embedded default does not
(it may have no mail server), and keeps its mail in the local mailbox, which a deployment never defaults
to."""

import os
import subprocess
import sys

from tests.test_settings import PRODUCTION_ENV, ROOT

READ = ("import django; django.setup(); from django.conf import settings; "
        "print(settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION, settings.EMAIL_BACKEND)")
CONSOLE = "django.core.mail.backends.console.EmailBackend"
MAILBOX = "clawhub.accounts.mailbox.EmailBackend"


def _required(env: dict[str, str]) -> str:
    """"<verification required> <email backend>" as the settings read them from ``env``."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("DJANGO_", "DATABASE_URL", "CLAWHUB_REQUIRE_EMAIL_VERIFICATION", "EMAIL_"))}
    out = subprocess.run([sys.executable, "-c", READ], cwd=ROOT, env={**clean, **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_production_requires_verified_addresses_by_default_and_can_be_told_not_to(tmp_path):
    assert _required(PRODUCTION_ENV) == f"True {CONSOLE}"
    assert _required({**PRODUCTION_ENV, "CLAWHUB_REQUIRE_EMAIL_VERIFICATION": "false"}) == f"False {CONSOLE}"
    embedded = {"DJANGO_SETTINGS_MODULE": "clawhub.settings.base", "CLAWHUB_DATA_DIR": str(tmp_path)}
    assert _required(embedded) == f"False {MAILBOX}"
