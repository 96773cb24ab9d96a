"""Server-rendered key pages. A new secret (a created or rotated key) is shown once, on the page the POST
redirects to (clawhub.keys.shown_once: no table holds it, masked or not), so a reload makes nothing twice.
Rotating and revoking ask for a confirmation first, on a page of their own (no JavaScript needed)."""

from urllib.parse import quote

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clawhub.core.api import client_ip
from clawhub.core.exceptions import ClawHubError, NotFound
from clawhub.core.forms import form_add_service_error
from clawhub.keys.clients import client_configs
from clawhub.keys.forms import KeyCreateForm, KeyEditForm
from clawhub.keys.models import ApiKey
from clawhub.keys.openclaw import DOWNLOAD_FILENAME, openclaw_config_json
from clawhub.keys.scopes import SCOPE_DESCRIPTIONS, Scope
from clawhub.keys.selectors import (
    group_for_key_binding,
    groups_for_key_binding,
    key_get_for_owner,
    keys_for_user,
    models_for_key,
)
from clawhub.keys.services import key_create, key_revoke, key_rotate, key_update
from clawhub.keys.shown_once import secret_forget, secret_stash, secret_take


def _own_key(request, key_id: int) -> ApiKey:
    try:
        return key_get_for_owner(key_id=key_id, user=request.user)
    except NotFound as exc:
        raise Http404(exc.message) from exc


def _secret_page(request, key: ApiKey, secret: str, *, rotated: bool) -> HttpResponse:
    """The page that shows a new secret (GET key_secret, after the redirect from the POST that made it)."""
    configs = client_configs(key=key, secret=secret)
    response = render(request, "keys/secret.html", {
        "key": key,
        "secret": secret,
        "rotated": rotated,
        **configs,
        # A data: URL lets the browser save the file with the secret in it without the server keeping it.
        "download_href": "data:application/json;charset=utf-8," + quote(configs["config_json"], safe=""),
        "download_filename": DOWNLOAD_FILENAME,
    })
    response["Cache-Control"] = "no-store"
    return secret_forget(response, key_id=key.pk)


@login_required
@require_GET
def key_secret(request, key_id: int):
    key = _own_key(request, key_id)
    taken = secret_take(request, key_id=key.pk)
    if taken is None:
        messages.info(request, "A key's secret is shown once, and ClawHub keeps no copy of it. If you did "
                               "not save it, rotate the key to get a new one.")
        return secret_forget(redirect("key_detail", key_id=key.pk), key_id=key.pk)
    secret, rotated = taken
    return _secret_page(request, key, secret, rotated=rotated)


def _to_secret_page(request, key: ApiKey, secret: str, *, rotated: bool) -> HttpResponse:
    return secret_stash(request, redirect("key_secret", key_id=key.pk), key_id=key.pk, secret=secret,
                        rotated=rotated)


def _confirmed(request) -> bool:
    """A change that cannot be undone goes ahead only from its confirmation page's form."""
    return request.POST.get("confirm") == "yes"


def _confirm_page(request, key: ApiKey, action: str) -> HttpResponse:
    """GET: the page that asks; a POST that did not come from it is sent there, and changes nothing."""
    if request.method == "POST":
        return redirect(f"key_{action}", key_id=key.pk)
    return render(request, "keys/confirm.html", {"key": key, "action": action})


@login_required
@require_http_methods(["GET", "POST"])
def keys(request):
    groups = list(groups_for_key_binding(user=request.user))
    form = KeyCreateForm(request.POST if request.method == "POST" else None, groups=groups)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        slug = data.pop("group")
        try:
            group = group_for_key_binding(slug=slug, user=request.user) if slug else None
            key, secret = key_create(owner=request.user, group=group, ip=client_ip(request), **data)
        except ClawHubError as exc:
            form_add_service_error(form, exc)
        else:
            return _to_secret_page(request, key, secret, rotated=False)
    return render(request, "keys/list.html", {"keys": keys_for_user(user=request.user), "form": form},
                  status=400 if form.errors else 200)


@login_required
@require_GET
def key_detail(request, key_id: int):
    key = _own_key(request, key_id)
    return _detail_page(request, key, KeyEditForm(key=key))


def _detail_page(request, key: ApiKey, form: KeyEditForm, *, status: int = 200) -> HttpResponse:
    return render(request, "keys/detail.html", {
        "key": key,
        "form": form,
        "models": models_for_key(key),
        "scopes": [(scope, SCOPE_DESCRIPTIONS[Scope(scope)]) for scope in key.scopes],
        **client_configs(key=key),
        "download_filename": DOWNLOAD_FILENAME,
    }, status=status)


@login_required
@require_POST
def key_edit(request, key_id: int):
    key = _own_key(request, key_id)
    form = KeyEditForm(request.POST, key=key)
    if form.is_valid():
        try:
            key_update(key=key, actor=request.user, ip=client_ip(request), **form.cleaned_data)
        except ClawHubError as exc:
            form_add_service_error(form, exc)
        else:
            messages.success(request, "Key updated.")
            return redirect("key_detail", key_id=key.pk)
    key.refresh_from_db()
    return _detail_page(request, key, form, status=400)


@login_required
@require_http_methods(["GET", "POST"])
def key_rotate_view(request, key_id: int):
    key = _own_key(request, key_id)
    if key.revoked_at is not None:
        messages.error(request, "This key is revoked; a revoked key cannot be rotated.")
        return redirect("key_detail", key_id=key.pk)
    if request.method == "GET" or not _confirmed(request):
        return _confirm_page(request, key, "rotate")
    try:
        secret = key_rotate(key=key, actor=request.user, ip=client_ip(request))
    except ClawHubError as exc:
        messages.error(request, exc.message)
        return redirect("key_detail", key_id=key.pk)
    return _to_secret_page(request, key, secret, rotated=True)


@login_required
@require_http_methods(["GET", "POST"])
def key_revoke_view(request, key_id: int):
    key = _own_key(request, key_id)
    if key.revoked_at is not None:
        messages.info(request, f"Key {key.name} is already revoked.")
        return redirect("key_detail", key_id=key.pk)
    if request.method == "GET" or not _confirmed(request):
        return _confirm_page(request, key, "revoke")
    reason = request.POST.get("reason", "")[:500]
    key_revoke(key=key, actor=request.user, ip=client_ip(request), reason=reason)
    messages.success(request, f"Key {key.name} revoked. Clients using it now get 401.")
    return redirect("key_detail", key_id=key.pk)


@login_required
@require_GET
def key_openclaw_download(request, key_id: int):
    """The OpenClaw config as a file, with the placeholder: the server no longer knows the secret."""
    key = _own_key(request, key_id)
    response = HttpResponse(openclaw_config_json(key=key), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{DOWNLOAD_FILENAME}"'
    return response
