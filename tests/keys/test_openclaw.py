import json
import shlex

import pytest

from clawhub.keys.openclaw import (
    SECRET_PLACEHOLDER,
    openclaw_config_json,
    openclaw_onboard_command,
    openclaw_provider_config,
)
from tests.factories import make_group, make_key, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _model_settings(settings):
    settings.PUBLIC_BASE_URL = "https://hub.example.org"
    settings.MODEL_CONTEXT_WINDOW = 65536
    settings.MODEL_MAX_TOKENS = 4096
    settings.MODEL_REASONING = True


def provider(config: dict) -> dict:
    return config["models"]["providers"]["clawhub"]


def test_personal_key_block_with_the_secret():
    key, secret = make_key(make_user())
    config = json.loads(openclaw_config_json(key=key, secret=secret))
    block = provider(config)
    assert block["baseUrl"] == "https://hub.example.org/v1"
    assert block["apiKey"] == secret
    assert block["api"] == "openai-completions"
    assert [m["id"] for m in block["models"]] == ["clawhub-personal", "base"]
    first = block["models"][0]
    assert first == {
        "id": "clawhub-personal", "name": first["name"], "reasoning": True, "input": ["text"],
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "contextWindow": 65536, "maxTokens": 4096,
    }
    assert config["agents"]["defaults"]["model"]["primary"] == "clawhub/clawhub-personal"


def test_group_key_block_names_the_group_model_and_uses_the_placeholder_later():
    owner = make_user()
    group = make_group(owner, name="Lab Rats")
    key, secret = make_key(owner, group=group)
    config = openclaw_provider_config(key=key)
    assert provider(config)["apiKey"] == SECRET_PLACEHOLDER
    assert secret not in json.dumps(config)
    assert [m["id"] for m in provider(config)["models"]] == ["clawhub-group-lab-rats", "base"]
    assert config["agents"]["defaults"]["model"]["primary"] == "clawhub/clawhub-group-lab-rats"


def test_block_lists_only_the_models_the_key_may_use():
    key, _ = make_key(make_user(), allowed_models=["base"])
    config = openclaw_provider_config(key=key)
    assert [m["id"] for m in provider(config)["models"]] == ["base"]
    assert config["agents"]["defaults"]["model"]["primary"] == "clawhub/base"


def test_explicit_base_url_wins_over_the_setting():
    key, _ = make_key(make_user())
    assert provider(openclaw_provider_config(key=key, base_url="http://10.0.0.5:8000/"))["baseUrl"] == (
        "http://10.0.0.5:8000/v1")


def test_onboard_command_with_the_secret_parses_back_to_the_right_arguments():
    owner = make_user()
    key, secret = make_key(owner, group=make_group(owner, name="Crew"))
    onboard, context, max_tokens = openclaw_onboard_command(key=key, secret=secret).splitlines()
    argv = shlex.split(onboard)
    assert argv[:6] == ["openclaw", "onboard", "--non-interactive", "--accept-risk", "--skip-health",
                        "--auth-choice"]
    options = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert options == {
        "--auth-choice": "custom-api-key",
        "--custom-base-url": "https://hub.example.org/v1",
        "--custom-model-id": "clawhub-group-crew",
        "--custom-api-key": secret,
        "--custom-provider-id": "clawhub",
        "--custom-compatibility": "openai",
    }
    # Onboarding writes OpenClaw's default limits; the lines after it set the served model's.
    assert shlex.split(context) == ["openclaw", "config", "set",
                                    "models.providers.clawhub.models[0].contextWindow", "65536"]
    assert shlex.split(max_tokens) == ["openclaw", "config", "set",
                                       "models.providers.clawhub.models[0].maxTokens", "4096"]


def test_onboard_command_without_the_secret_reads_it_from_the_environment():
    key, secret = make_key(make_user())
    command = openclaw_onboard_command(key=key)
    assert secret not in command
    assert '--custom-api-key "$CLAWHUB_API_KEY"' in command


def test_onboard_command_quotes_hostile_values(settings):
    settings.PUBLIC_BASE_URL = "https://hub.example.org/a b;rm -rf ~"
    key, _ = make_key(make_user())
    argv = shlex.split(openclaw_onboard_command(key=key, secret="chk_x").splitlines()[0])
    assert argv[argv.index("--custom-base-url") + 1] == "https://hub.example.org/a b;rm -rf ~/v1"


@pytest.fixture
def served(settings, monkeypatch):
    """Limits from the served model: no overrides, and an upstream whose /v1/models says ``max_model_len``."""
    from django.core.cache import cache

    from clawhub.core import model_limits as limits

    settings.MODEL_CONTEXT_WINDOW = settings.MODEL_MAX_TOKENS = None
    settings.CLAWHUB_UPSTREAMS = [{"url": "http://vllm.invalid:8000", "base_model": "tiny"}]
    cache.delete_many([limits.SERVED_CACHE_KEY, f"{limits.SERVED_CACHE_KEY}:last"])
    calls = []

    def answer(upstreams):
        calls.append(upstreams)
        return answer.value

    answer.value = 2048
    monkeypatch.setattr(limits, "served_max_model_len", answer)
    yield answer, calls
    cache.delete_many([limits.SERVED_CACHE_KEY, f"{limits.SERVED_CACHE_KEY}:last"])


def test_limits_come_from_the_served_model_and_are_cached(served):
    answer, calls = served
    key, secret = make_key(make_user())
    first = provider(openclaw_provider_config(key=key, secret=secret))["models"][0]
    assert (first["contextWindow"], first["maxTokens"]) == (2048, 512)  # a quarter of the context
    lines = openclaw_onboard_command(key=key, secret=secret).splitlines()
    assert lines[1].endswith(" 2048") and lines[2].endswith(" 512")
    assert len(calls) == 1  # cached: one look at /v1/models for both renderings
    answer.value = None  # every upstream down: the last value seen is still the truth
    from django.core.cache import cache

    from clawhub.core import model_limits as limits

    cache.delete(limits.SERVED_CACHE_KEY)
    assert limits.served_limits() == limits.ModelLimits(2048, 512, "last-served")


def test_a_setting_overrides_the_served_value(served, settings):
    settings.MODEL_CONTEXT_WINDOW = 65536
    key, _ = make_key(make_user())
    first = provider(openclaw_provider_config(key=key))["models"][0]
    assert (first["contextWindow"], first["maxTokens"]) == (65536, 8192)
    settings.MODEL_CONTEXT_WINDOW, settings.MODEL_MAX_TOKENS = None, 100
    first = provider(openclaw_provider_config(key=key))["models"][0]
    assert (first["contextWindow"], first["maxTokens"]) == (2048, 100)


@pytest.mark.parametrize(("context", "expected"), [(2048, 512), (4096, 1024), (32768, 8192), (131072, 8192),
                                                   (300, 150)])
def test_max_tokens_rule(context, expected):
    from clawhub.core.model_limits import max_tokens_for

    assert max_tokens_for(context) == expected
