import shlex
import tomllib

import pytest

from clawhub.keys.codex import codex_config
from clawhub.keys.openclaw import SECRET_PLACEHOLDER
from tests.factories import add_member, make_group, make_key, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("client_settings")]


def parsed(text: str) -> tuple[dict, dict[str, str]]:
    """The config.toml part as TOML, and the exported variables."""
    toml, _, shell = text.partition("# in the shell that runs codex")
    exports = dict(shlex.split(line)[1].split("=", 1) for line in shell.strip().splitlines())
    return tomllib.loads(toml), exports


def test_codex_gets_a_responses_provider_with_the_real_limits_and_the_key_in_its_variable():
    key, secret = make_key(make_user())
    config, exports = parsed(codex_config(key=key, secret=secret))
    assert config == {
        "model": "clawhub-personal", "model_provider": "clawhub",
        "model_context_window": 65536,
        "model_providers": {"clawhub": {
            "name": "ClawHub", "base_url": "https://hub.example.org/v1", "env_key": "CLAWHUB_API_KEY",
            "wire_api": "responses", "requires_openai_auth": False}},
    }
    assert exports == {"CLAWHUB_API_KEY": secret}


def test_without_the_secret_a_placeholder_and_a_group_key_uses_the_group_adapter():
    group = make_group(owner=make_user())
    key, _ = make_key(add_member(group), group=group)
    config, exports = parsed(codex_config(key=key))
    assert config["model"] == f"clawhub-group-{group.slug}"
    assert exports == {"CLAWHUB_API_KEY": SECRET_PLACEHOLDER}


def test_the_key_page_shows_it(own_key_page):
    page = own_key_page
    assert 'id="codex-config"' in page and "wire_api = &quot;responses&quot;" in page
