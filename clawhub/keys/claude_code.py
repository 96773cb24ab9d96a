"""What a user sets to point Claude Code at a key: environment variables for its Anthropic client.

Claude Code talks to ``$ANTHROPIC_BASE_URL/v1/messages`` (the gateway's Messages route, so the base URL has
no ``/v1``) and sends ``ANTHROPIC_AUTH_TOKEN`` as a Bearer token. Both of its models, the main one and the
one it uses for background work (``ANTHROPIC_DEFAULT_HAIKU_MODEL``), are the tenant's adapter, and its output
cap and context window are the served model's real ones, from the same model description as the OpenClaw
block.

The clear secret exists only in the response to a create or rotate; every later rendering passes
``secret=None`` and gets a placeholder instead.
"""

import shlex

from django.conf import settings

from clawhub.core.model_limits import served_limits
from clawhub.keys.models import ApiKey
from clawhub.keys.openclaw import SECRET_PLACEHOLDER, primary_model_id
from clawhub.keys.selectors import key_tenant


def claude_code_env(*, key: ApiKey, secret: str | None = None, base_url: str | None = None) -> str:
    """``export`` lines for a POSIX shell, one per variable."""
    model = primary_model_id(key, key_tenant(key))
    limits = served_limits()
    variables = {
        "ANTHROPIC_BASE_URL": (base_url or settings.PUBLIC_BASE_URL).rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": secret or SECRET_PLACEHOLDER,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(limits.max_tokens),
        # Claude Code takes a model it does not know for a 1,000,000-token one (2.1.332) and would not compact
        # the conversation before it outgrew the served context.
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(limits.context_window),
    }
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in variables.items())
