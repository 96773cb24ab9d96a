"""Model names, in one place: the ids clients send (``clawhub-personal``, ``clawhub-group-<slug>``, ``base``),
the names adapters have on the upstream vLLM (``t<tenant>-v<version>``), and the one rule for which ids a key
may use. Plain strings in, plain strings out (no Django), so the gateway's hot path, the key pages, groups,
metrics and the adapters all call the same functions.

A per-key model alias is one change here: offer it in ``models_offered`` and map it in the caller that turns
an id into an adapter.
"""

from collections.abc import Iterable
from typing import Literal

PERSONAL_MODEL_ID = "clawhub-personal"
GROUP_MODEL_PREFIX = "clawhub-group-"
# ``<tenant id>:v<version>`` names one version of the tenant's adapter, whatever is active (the playground's
# comparisons). A colon cannot occur in a group slug, so the split is unambiguous.
VERSION_SEPARATOR = ":v"
# The shared base model with no adapter; every tenant may use it.
BASE_MODEL_ID = "base"


def group_model_id(slug: str) -> str:
    """The id clients send for a group's adapter."""
    return f"{GROUP_MODEL_PREFIX}{slug}"


def tenant_model_id(*, group_slug: str | None) -> str:
    """The id clients send for a tenant's adapter: its group's, or ``clawhub-personal`` for a user."""
    return group_model_id(group_slug) if group_slug is not None else PERSONAL_MODEL_ID


def version_model_id(tenant_model_id: str, version: int) -> str:
    """The id that names one version of a tenant's adapter: ``clawhub-personal:v3``."""
    return f"{tenant_model_id}{VERSION_SEPARATOR}{version}"


def split_version(model: str) -> tuple[str, int | None]:
    """``clawhub-personal:v3`` -> (``clawhub-personal``, 3); an id without a version -> (the id, None). A
    malformed version (``:v0``, ``:vx``, ``:v03``) is left in the id, which then names nothing."""
    head, sep, tail = model.rpartition(VERSION_SEPARATOR)
    if sep and tail.isdecimal() and tail.isascii() and not tail.startswith("0"):
        return head, int(tail)
    return model, None


def is_adapter_model_id(model: str) -> bool:
    """Whether ``model`` names some tenant's adapter (this key's or another's), as opposed to the base or an
    unknown id."""
    return model == PERSONAL_MODEL_ID or model.startswith(GROUP_MODEL_PREFIX)


def upstream_adapter_name(*, tenant_id: int, version: int) -> str:
    """The LoRA name a version has on vLLM. Never reused for different weights: vLLM caches by name (a stale
    prefix cache otherwise)."""
    return f"t{tenant_id}-v{version}"


def models_offered(*, tenant_model_id: str) -> list[str]:
    """Every id a key of this tenant could be allowed, in the order /v1/models lists them: the tenant's
    adapter first, then the base."""
    return [tenant_model_id, BASE_MODEL_ID]


def models_for_key(*, tenant_model_id: str, allowed_models: Iterable[str] | None) -> list[str]:
    """The ids a key may use: what its tenant offers, narrowed to ``allowed_models`` (empty or None: all)."""
    offered = models_offered(tenant_model_id=tenant_model_id)
    allowed = set(allowed_models or ())
    return [model for model in offered if not allowed or model in allowed]


def model_access(*, model: str, tenant_model_id: str, allowed_models: Iterable[str] | None,
                 versions: bool = False) -> Literal["ok", "not_allowed", "not_found"]:
    """What a request for ``model`` with this key gets: ``ok``; ``not_allowed`` for an id that exists but not
    for this key (another tenant's adapter, or one its ``allowed_models`` leaves out); ``not_found`` for an id
    that names nothing. ``versions``: the key may name a version of its tenant's adapter (playground keys
    only); whether that version exists is the gateway's to find out."""
    named, version = split_version(model)
    if version is not None:
        if not is_adapter_model_id(named):
            return "not_found"
        if not versions:
            return "not_allowed"
        model = named
    if model in models_for_key(tenant_model_id=tenant_model_id, allowed_models=allowed_models):
        return "ok"
    if is_adapter_model_id(model) or model in models_offered(tenant_model_id=tenant_model_id):
        return "not_allowed"
    return "not_found"


def metric_label(model: str | None) -> str:
    """The ``model`` label of a metric, with few distinct values: group ids (one per group) fold into
    ``clawhub-group``; anything that is not a ClawHub id is ``other``."""
    if not model:
        return "none"
    if model.startswith(GROUP_MODEL_PREFIX):
        return GROUP_MODEL_PREFIX.rstrip("-")
    if model in (PERSONAL_MODEL_ID, BASE_MODEL_ID):
        return model
    named, version = split_version(model)
    if version is not None:
        return metric_label(named)
    return "other"
