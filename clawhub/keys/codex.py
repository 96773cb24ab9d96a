"""What a user sets to point Codex CLI at a key: a custom provider in ``~/.codex/config.toml`` and the
environment variable it reads the key from.

Codex speaks only the Responses API (``wire_api = "responses"``) and appends ``/responses`` to the provider's
``base_url`` (this server's ``/v1``). The model is the tenant's adapter, and the context window is the served
model's real one, from the same model description as the OpenClaw block (Codex does not know a model outside
its own catalogue and would otherwise assume its defaults). Codex 0.171 has no output cap setting (it refuses
``model_max_output_tokens`` under ``--strict-config`` and ignores it otherwise) and sends no
``max_output_tokens``: the gateway clamps the output to what the context leaves.

The clear secret exists only in the response to a create or rotate; every later rendering passes
``secret=None`` and gets a placeholder instead.
"""

import json
import shlex

from django.conf import settings

from clawhub.core.model_limits import served_limits
from clawhub.keys.models import ApiKey
from clawhub.keys.openclaw import SECRET_PLACEHOLDER, primary_model_id
from clawhub.keys.selectors import key_tenant

PROVIDER_ID = "clawhub"
KEY_VARIABLE = "CLAWHUB_API_KEY"


def codex_config(*, key: ApiKey, secret: str | None = None, base_url: str | None = None) -> str:
    """The ``config.toml`` lines, then the ``export`` line for the key."""
    limits = served_limits()
    url = f"{(base_url or settings.PUBLIC_BASE_URL).rstrip('/')}/v1"
    # json.dumps writes a string TOML reads back unchanged (TOML's basic strings use JSON's escapes).
    lines = [
        "# ~/.codex/config.toml",
        f"model = {json.dumps(primary_model_id(key, key_tenant(key)))}",
        f"model_provider = {json.dumps(PROVIDER_ID)}",
        f"model_context_window = {limits.context_window}",
        "",
        f"[model_providers.{PROVIDER_ID}]",
        'name = "ClawHub"',
        f"base_url = {json.dumps(url)}",
        f"env_key = {json.dumps(KEY_VARIABLE)}",
        'wire_api = "responses"',
        "requires_openai_auth = false",
        "",
        "# in the shell that runs codex",
        f"export {KEY_VARIABLE}={shlex.quote(secret or SECRET_PLACEHOLDER)}",
    ]
    return "\n".join(lines)
