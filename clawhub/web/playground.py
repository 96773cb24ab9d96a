"""The playground: one prompt answered by the base model and by a version of the user's adapter, side by side.

The page is a client of /v1 like any other: the browser sends both requests to the gateway itself. Its key is
minted here for the signed-in user (``keys.services.playground_key_mint``) and handed to the page's script,
which keeps it in memory only: nothing to paste, nothing in the browser's storage, only a digest on the
server, an hour of life, inference only, and turns that are never trained on unless rated.
"""

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from clawhub.adapters.models import AdapterVersion
from clawhub.core.api import client_ip
from clawhub.core.views import page_errors
from clawhub.tenants import naming


@dataclass(frozen=True)
class Choice:
    """One adapter the user may try: its tenant's model id (served as the active version) and its versions."""

    label: str
    group: str  # the group's slug, "" for the personal adapter: which key the page asks for
    model_id: str
    active: AdapterVersion | None
    versions: list[tuple[str, AdapterVersion]]  # (model id, version), newest first


def playground_choices(*, user) -> list[Choice]:
    """The personal adapter, then each group's the user may send requests to (member or above)."""
    from clawhub.adapters.selectors import adapter_versions
    from clawhub.keys.selectors import groups_for_key_binding

    tenants = [("Personal", "", user.tenant)]
    tenants += [(f"Group {g.name}", g.slug, g.tenant) for g in groups_for_key_binding(user=user)]
    choices = []
    for label, slug, tenant in tenants:
        versions = [v for v in adapter_versions(tenant=tenant) if v.artifact_path]
        model_id = tenant.model_id
        choices.append(Choice(
            label=label, group=slug, model_id=model_id,
            active=next((v for v in versions if v.state == AdapterVersion.State.ACTIVE), None),
            versions=[(naming.version_model_id(model_id, v.version), v) for v in versions]))
    return choices


@login_required
@require_GET
def playground(request: HttpRequest):
    return render(request, "web/playground.html", {
        "choices": playground_choices(user=request.user),
        "base_model": naming.BASE_MODEL_ID,
    })


@never_cache
@login_required
@require_POST
@page_errors
def playground_key(request: HttpRequest):
    """A fresh playground key for the page's script (CSRF-checked like every POST); the earlier one of the
    same adapter stops working. The answer is never cached."""
    from clawhub.keys.selectors import group_for_key_binding
    from clawhub.keys.services import playground_key_mint

    slug = request.POST.get("group", "")
    group = group_for_key_binding(slug=slug, user=request.user) if slug else None
    key, secret = playground_key_mint(actor=request.user, group=group, ip=client_ip(request))
    return JsonResponse({"key": secret, "expires_at": key.expires_at.isoformat()})
