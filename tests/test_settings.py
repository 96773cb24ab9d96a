import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION_ENV = {
    "DJANGO_SETTINGS_MODULE": "clawhub.settings.production",
    "DJANGO_SECRET_KEY": "x" * 60 + "-production-check-only-9f3a",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
    "DJANGO_ALLOWED_HOSTS": "hub.example.com",
}
# Left to the operator's reverse proxy, which terminates TLS (see README "Production").
HTTPS_ITEMS_SET_AT_THE_PROXY = {"security.W004", "security.W008"}


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_passes_apart_from_the_https_items_set_at_the_proxy():
    result = _manage("check", "--deploy", env=PRODUCTION_ENV)
    assert result.returncode == 0, result.stderr
    reported = set(re.findall(r"\((\w+\.[EW]\d+)\)", result.stdout + result.stderr))
    assert reported <= HTTPS_ITEMS_SET_AT_THE_PROXY, reported


def test_production_refuses_to_start_without_its_secrets():
    for missing in ("DJANGO_SECRET_KEY", "DATABASE_URL", "DJANGO_ALLOWED_HOSTS"):
        env = {k: v for k, v in PRODUCTION_ENV.items() if k != missing}
        result = _manage("check", env=env)
        assert result.returncode != 0
        assert f"{missing} must be set in production" in result.stderr


def test_embedded_default_uses_sqlite_and_a_serverless_broker(tmp_path):
    env = {"DJANGO_SETTINGS_MODULE": "clawhub.settings.base", "CLAWHUB_DATA_DIR": str(tmp_path)}
    code = ("from django.conf import settings; import django; django.setup(); "
            "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL)")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_"))}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["django.db.backends.sqlite3", "filesystem://"]


def test_test_suite_runs_on_postgresql(settings):
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"


def test_tenants_train_at_the_base_models_learning_rate_unless_the_operator_sets_one(tmp_path):
    from workers import base_models

    code = ("from django.conf import settings; import django; django.setup(); "
            "print(settings.CLAWHUB_TRAIN_DEFAULTS.get('lr'))")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_", "CLAWHUB_"))}
    smollm2 = tmp_path / "smollm2"
    smollm2.mkdir()
    (smollm2 / base_models.MARKER_FILE).write_text('{"model": "smollm2-135m-instruct"}')

    def lr(**env) -> str:
        env = {**clean, "DJANGO_SETTINGS_MODULE": "clawhub.settings.base", "CLAWHUB_DATA_DIR": str(tmp_path),
               **env}
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert lr(CLAWHUB_BASE_MODEL=str(smollm2)) == "0.0003"
    assert lr(CLAWHUB_BASE_MODEL=str(smollm2), CLAWHUB_TRAIN_DEFAULTS='{"lr": 5e-05}') == "5e-05"
    assert lr(CLAWHUB_BASE_MODEL=str(base_models.TINY_MODEL_DIR)) == "None"  # TrainConfig's own
