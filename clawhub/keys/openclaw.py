"""What a user pastes into OpenClaw to use a key: the ``models.providers`` block of
``~/.openclaw/openclaw.json``, or the equivalent commands: ``openclaw onboard`` and two ``openclaw config
set`` lines (three for a model that calls no tools).

Both carry the served model's real limits (``contextWindow`` from vLLM's ``max_model_len``, ``maxTokens``
from its description or derived from the context; see clawhub/core/model_limits.py), and, for a model whose
chat template has no tool format, ``compat.supportsTools: false``: OpenClaw then sends no tool schemas.
Onboarding cannot set them: OpenClaw 2026.9's onboard has no such flags and writes 128000 / 4096 whatever
the model, so the config lines follow it. The onboard line
also carries what a first non-interactive run needs: ``--accept-risk`` (it refuses to run without the
acknowledgement) and ``--skip-health`` (otherwise it waits for an OpenClaw gateway daemon a new user does not
run yet).

The clear secret exists only in the response to a create or rotate; every later rendering passes
``secret=None`` and gets a placeholder instead.
"""

import json
import shlex

from django.conf import settings

from clawhub.core.model_limits import served_limits
from clawhub.keys.models import ApiKey
from clawhub.keys.selectors import BASE_MODEL_ID, key_tenant, models_for_key
from clawhub.tenants.models import Tenant

PROVIDER_ID = "clawhub"
SECRET_PLACEHOLDER = "<paste your ClawHub key>"
# Left unquoted-for-expansion in the onboard command so that the user's shell fills it in.
SECRET_ENV_REFERENCE = '"$CLAWHUB_API_KEY"'
DOWNLOAD_FILENAME = "openclaw-clawhub.json"


def _v1_url(base_url: str | None) -> str:
    return f"{(base_url or settings.PUBLIC_BASE_URL).rstrip('/')}/v1"


def _model_name(model_id: str, tenant: Tenant) -> str:
    if model_id == BASE_MODEL_ID:
        return "ClawHub base model"
    if tenant.kind == Tenant.Kind.GROUP:
        return f"ClawHub {tenant.group.name} (group adapter)"
    return "ClawHub personal adapter"


def primary_model_id(key: ApiKey, tenant: Tenant) -> str:
    # The tenant's adapter is what trains from use; fall back to whatever the key is limited to.
    allowed = models_for_key(key, tenant=tenant)
    return tenant.model_id if tenant.model_id in allowed else allowed[0]


def openclaw_provider_config(*, key: ApiKey, secret: str | None = None, base_url: str | None = None) -> dict:
    """The ``models.providers.clawhub`` block (and the default agent model) for ``openclaw.json``."""
    tenant = key_tenant(key)
    limits = served_limits()
    models = [
        {
            "id": model_id,
            "name": _model_name(model_id, tenant),
            "reasoning": settings.MODEL_REASONING,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": limits.context_window,
            "maxTokens": limits.max_tokens,
            **({} if limits.calls_tools else {"compat": {"supportsTools": False}}),
        }
        for model_id in models_for_key(key, tenant=tenant)
    ]
    return {
        "models": {
            "providers": {
                PROVIDER_ID: {
                    "baseUrl": _v1_url(base_url),
                    "apiKey": secret or SECRET_PLACEHOLDER,
                    "api": "openai-completions",
                    "models": models,
                }
            }
        },
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER_ID}/{primary_model_id(key, tenant)}"}}},
    }


def openclaw_config_json(*, key: ApiKey, secret: str | None = None, base_url: str | None = None) -> str:
    return json.dumps(openclaw_provider_config(key=key, secret=secret, base_url=base_url), indent=2)


def openclaw_onboard_command(*, key: ApiKey, secret: str | None = None, base_url: str | None = None) -> str:
    """The setup commands, one per line: ``openclaw onboard`` for a non-interactive first run, then the
    ``openclaw config set`` lines that give the model its real limits. Without the secret it reads
    ``$CLAWHUB_API_KEY``."""
    tenant = key_tenant(key)
    api_key = shlex.quote(secret) if secret else SECRET_ENV_REFERENCE
    limits = served_limits()
    onboard = " ".join([
        "openclaw onboard --non-interactive --accept-risk --skip-health --auth-choice custom-api-key",
        f"--custom-base-url {shlex.quote(_v1_url(base_url))}",
        f"--custom-model-id {shlex.quote(primary_model_id(key, tenant))}",
        f"--custom-api-key {api_key}",
        f"--custom-provider-id {PROVIDER_ID} --custom-compatibility openai",
    ])
    model = f"models.providers.{PROVIDER_ID}.models[0]"  # onboarding writes the one model it was given
    lines = [
        onboard,
        f"openclaw config set {shlex.quote(model + '.contextWindow')} {limits.context_window}",
        f"openclaw config set {shlex.quote(model + '.maxTokens')} {limits.max_tokens}",
    ]
    if not limits.calls_tools:
        lines.append(f"openclaw config set {shlex.quote(model + '.compat.supportsTools')} false")
    return "\n".join(lines)
