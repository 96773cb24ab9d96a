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
    argv = shlex.split(openclaw_onboard_command(key=key, secret=secret))
    assert argv[:4] == ["openclaw", "onboard", "--non-interactive", "--auth-choice"]
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert options == {
        "--auth-choice": "custom-api-key",
        "--custom-base-url": "https://hub.example.org/v1",
        "--custom-model-id": "clawhub-group-crew",
        "--custom-api-key": secret,
        "--custom-provider-id": "clawhub",
        "--custom-compatibility": "openai",
    }


def test_onboard_command_without_the_secret_reads_it_from_the_environment():
    key, secret = make_key(make_user())
    command = openclaw_onboard_command(key=key)
    assert secret not in command
    assert '--custom-api-key "$CLAWHUB_API_KEY"' in command


def test_onboard_command_quotes_hostile_values(settings):
    settings.PUBLIC_BASE_URL = "https://hub.example.org/a b;rm -rf ~"
    key, _ = make_key(make_user())
    argv = shlex.split(openclaw_onboard_command(key=key, secret="chk_x"))
    assert argv[argv.index("--custom-base-url") + 1] == "https://hub.example.org/a b;rm -rf ~/v1"
