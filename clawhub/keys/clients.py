"""What the key pages and onboarding show for a key: each client's configuration, with the secret written in
when the page has it (only right after the key was created or rotated), else a placeholder."""

from clawhub.keys.claude_code import claude_code_env
from clawhub.keys.codex import codex_config
from clawhub.keys.models import ApiKey
from clawhub.keys.openclaw import openclaw_config_json, openclaw_onboard_command


def client_configs(*, key: ApiKey, secret: str | None = None) -> dict[str, str]:
    """Template context: OpenClaw's config file (``config_json``) and onboard command, Claude Code's
    environment, Codex's config."""
    return {
        "config_json": openclaw_config_json(key=key, secret=secret),
        "onboard_command": openclaw_onboard_command(key=key, secret=secret),
        "claude_code_env": claude_code_env(key=key, secret=secret),
        "codex_config": codex_config(key=key, secret=secret),
    }
