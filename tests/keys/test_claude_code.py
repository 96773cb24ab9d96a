import shlex

import pytest

from clawhub.keys.claude_code import claude_code_env
from clawhub.keys.openclaw import SECRET_PLACEHOLDER
from tests.factories import add_member, make_group, make_key, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("client_settings")]


def variables(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        words = shlex.split(line)
        assert words[0] == "export" and len(words) == 2
        name, _, value = words[1].partition("=")
        out[name] = value
    return out


def test_claude_code_points_at_the_messages_route_with_the_secret_and_the_real_output_cap():
    key, secret = make_key(make_user())
    assert variables(claude_code_env(key=key, secret=secret)) == {
        "ANTHROPIC_BASE_URL": "https://hub.example.org",  # Claude Code adds /v1/messages itself
        "ANTHROPIC_AUTH_TOKEN": secret,
        "ANTHROPIC_MODEL": "clawhub-personal",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "clawhub-personal",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "65536",
    }


def test_without_the_secret_a_placeholder_and_a_group_key_uses_the_group_adapter():
    owner = make_user()
    group = make_group(owner=owner)
    key, _ = make_key(add_member(group), group=group)
    env = variables(claude_code_env(key=key))
    assert env["ANTHROPIC_AUTH_TOKEN"] == SECRET_PLACEHOLDER
    assert env["ANTHROPIC_MODEL"] == f"clawhub-group-{group.slug}"


def test_the_key_page_shows_it(own_key_page):
    page = own_key_page
    assert 'id="claude-code-env"' in page and "export ANTHROPIC_MODEL=clawhub-personal" in page
