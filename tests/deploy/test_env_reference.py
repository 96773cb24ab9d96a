"""Every setting the code reads is documented: in deploy/env.example and in deploy/README.md's table."""

import yaml

from tests.deploy.conftest import (
    DEPLOY,
    env_example_names,
    markdown_table_names,
    settings_read_by_code,
)


def test_the_scanner_finds_settings_read_every_way():
    found = settings_read_by_code()
    # env.str / env.db / env.json in settings, os.environ.get in a management command and in deploy/.
    assert {
        "DJANGO_SECRET_KEY",
        "DATABASE_URL",
        "CLAWHUB_UPSTREAMS",
        "CLAWHUB_PORT",
        "WEB_CONCURRENCY",
    } <= set(found)
    assert "FAKE_BASE_MODEL" not in found


def test_every_setting_is_in_env_example():
    missing = {
        name: sorted(files)
        for name, files in settings_read_by_code().items()
        if name not in env_example_names()
    }
    assert not missing, f"add these to deploy/env.example: {missing}"


def test_every_setting_is_in_the_readme_configuration_table():
    documented = markdown_table_names(DEPLOY / "README.md", "Configuration")
    missing = {
        name: sorted(files) for name, files in settings_read_by_code().items() if name not in documented
    }
    assert not missing, f"add these to the Configuration table of deploy/README.md: {missing}"


def test_env_example_has_no_real_secrets():
    text = (DEPLOY / "env.example").read_text()
    for line in text.splitlines():
        name, sep, value = line.lstrip("# ").partition("=")
        if sep and name.endswith(("SECRET_KEY", "PASSWORD", "TOKEN")):
            assert value == "" or "change-me" in value, f"{name} looks like a real secret in env.example"
        # Credentials embedded in URLs must be placeholders too.
        if sep and "://" in value and "@" in value:
            assert "change-me" in value or "://postgres@" in value or "user:" in value, line


def test_configmap_only_holds_known_settings_and_no_secrets():
    configmap = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())
    known = env_example_names()
    unknown = set(configmap["data"]) - known
    assert not unknown, f"ConfigMap keys not in env.example (typo?): {unknown}"
    for secret in (
        "DJANGO_SECRET_KEY",
        "DATABASE_URL",
        "METRICS_TOKEN",
        "EMAIL_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
    ):
        assert secret not in configmap["data"], f"{secret} belongs in the Secret clawhub-secrets"
