import json
import shlex
import socket

import pytest

from clawhub.keys.openclaw import (
    SECRET_PLACEHOLDER,
    openclaw_config_json,
    openclaw_onboard_command,
    openclaw_provider_config,
)
from tests.factories import make_group, make_key, make_user
from workers.base_models import MARKER_FILE, SMOLLM2, TINY, TINY_MODEL_DIR

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _model_settings(client_settings):
    client_settings.PUBLIC_BASE_URL = "https://hub.example.org"  # no trailing slash: /v1 is still joined once
    client_settings.MODEL_REASONING = True


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
def listener(settings):
    """No overrides, and an upstream at a socket that listens but never answers: the limits must come from the
    model description, without connecting to it."""
    settings.MODEL_CONTEXT_WINDOW = settings.MODEL_MAX_TOKENS = None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        port = sock.getsockname()[1]
        settings.CLAWHUB_UPSTREAMS = [{"url": f"http://127.0.0.1:{port}", "base_model": "tiny"}]
        yield sock


def _connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


@pytest.mark.parametrize(("start_vllm", "vllm_args", "expected"), [
    (False, "", (TINY.max_model_len, 8192)),  # upstreams elsewhere serve the description's context
    (True, "--max-model-len 4096", (4096, 1024)),  # the vLLM serve starts: its command line's last word
    (True, "--max-model-len=2048 --dtype float32", (2048, 512)),
    (False, "--max-model-len 4096", (TINY.max_model_len, 8192)),  # given to no vLLM: not the served context
])
def test_limits_come_from_the_model_description_without_asking_a_server(listener, settings, start_vllm,
                                                                         vllm_args, expected):
    settings.CLAWHUB_BASE_MODEL = str(TINY_MODEL_DIR)
    settings.CLAWHUB_START_VLLM, settings.CLAWHUB_VLLM_ARGS = start_vllm, vllm_args
    key, secret = make_key(make_user())
    first = provider(openclaw_provider_config(key=key, secret=secret))["models"][0]
    assert (first["contextWindow"], first["maxTokens"]) == expected
    lines = openclaw_onboard_command(key=key, secret=secret).splitlines()
    assert lines[1].endswith(f" {expected[0]}") and lines[2].endswith(f" {expected[1]}")
    assert not _connected(listener)


def test_the_key_page_and_onboarding_connect_to_no_upstream(listener, client):
    user = make_user()
    key, _ = make_key(user)
    client.force_login(user)
    assert client.get(f"/keys/{key.pk}/").status_code == 200
    created = client.post("/onboarding/")
    assert created.status_code == 302
    page = client.get(created["Location"])
    assert page.status_code == 200 and b"contextWindow" in page.content
    assert not _connected(listener)


def test_a_model_without_a_tool_format_is_configured_to_send_no_tools_and_a_bounded_output(listener, settings,
                                                                                         tmp_path):
    """SmolLM2's description: no tool format in its template (OpenClaw then sends no tool schemas) and the
    output limit it was measured to need; the tiny model keeps its tools and a quarter of its context."""
    (tmp_path / MARKER_FILE).write_text(json.dumps({"model": SMOLLM2.key}))
    settings.CLAWHUB_BASE_MODEL, settings.CLAWHUB_START_VLLM = str(tmp_path), True
    settings.CLAWHUB_VLLM_ARGS = ""
    key, secret = make_key(make_user())
    first = provider(openclaw_provider_config(key=key, secret=secret))["models"][0]
    assert (first["contextWindow"], first["maxTokens"]) == (SMOLLM2.max_model_len, 512)
    assert first["compat"] == {"supportsTools": False}
    lines = openclaw_onboard_command(key=key, secret=secret).splitlines()
    assert len(lines) == 4 and lines[2].endswith(" 512")
    assert shlex.split(lines[3])[3:] == ["models.providers.clawhub.models[0].compat.supportsTools", "false"]
    settings.MODEL_MAX_TOKENS = 100  # the operator's setting still wins
    assert provider(openclaw_provider_config(key=key))["models"][0]["maxTokens"] == 100

    settings.CLAWHUB_BASE_MODEL, settings.MODEL_MAX_TOKENS = str(TINY_MODEL_DIR), None
    first = provider(openclaw_provider_config(key=key))["models"][0]
    assert "compat" not in first and first["maxTokens"] == 8192
    assert len(openclaw_onboard_command(key=key).splitlines()) == 3


def test_a_setting_overrides_the_model_description(settings):
    settings.CLAWHUB_START_VLLM, settings.CLAWHUB_VLLM_ARGS = True, "--max-model-len 2048"
    settings.MODEL_CONTEXT_WINDOW = 65536
    settings.MODEL_MAX_TOKENS = None
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
