"""The "connect OpenClaw" page a new user lands on after signing up: create a key, copy the OpenClaw config or
the onboard commands, send a test request through the gateway, and watch a checklist tick itself.

The POST that creates the key redirects to this page with the new key's id, carrying the secret across that
one redirect as the key pages do (clawhub.keys.shown_once: no table holds it), so a reload makes no second key
and no longer shows the secret. The test request is made by the browser from that page, straight to this
site's /v1 with the secret the page already shows, so the server needs the secret nowhere else.
"""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from clawhub.core.api import client_ip
from clawhub.core.exceptions import ClawHubError, NotFound
from clawhub.keys.clients import client_configs
from clawhub.keys.openclaw import PROVIDER_ID
from clawhub.keys.selectors import key_get_for_owner, keys_for_user
from clawhub.keys.services import key_create
from clawhub.keys.shown_once import secret_forget, secret_stash, secret_take
from clawhub.web.checklist import onboarding_checklist

KEY_NAME = "OpenClaw"
TEST_PROMPT = "Hello! In one short sentence: what can you help me with?"
POLL_SECONDS = 3


def _test_model(config: dict) -> str:
    """The model the OpenClaw config makes the agent's default (``clawhub/<id>``), else its first model."""
    primary = config.get("agents", {}).get("defaults", {}).get("model", {}).get("primary", "")
    if primary.startswith(f"{PROVIDER_ID}/"):
        return primary.removeprefix(f"{PROVIDER_ID}/")
    return config["models"]["providers"][PROVIDER_ID]["models"][0]["id"]


@login_required
@require_http_methods(["GET", "POST"])
def onboarding(request):
    context = {"checklist": onboarding_checklist(user=request.user), "poll_seconds": POLL_SECONDS,
               "test_prompt": TEST_PROMPT, "key_count": keys_for_user(user=request.user).count()}
    page = reverse("onboarding")
    status = 200
    if request.method == "POST":
        try:
            key, secret = key_create(owner=request.user, name=KEY_NAME, ip=client_ip(request))
        except ClawHubError as exc:
            context["error"], status = exc.message, exc.status
        else:
            return secret_stash(request, redirect(f"{page}?key={key.pk}"), key_id=key.pk, secret=secret,
                                rotated=False, page=page)
    elif request.GET.get("key"):
        key = _own_key(request, request.GET["key"])
        taken = secret_take(request, key_id=key.pk)
        if taken is None:  # a reload, or another browser: the secret was shown once
            messages.info(request, f"The secret of the key '{key.name}' was shown once, and ClawHub keeps no "
                                   "copy of it. If you did not save it, rotate the key under API keys.")
            return secret_forget(redirect(page), key_id=key.pk, page=page)
        secret = taken[0]
        configs = client_configs(key=key, secret=secret)
        context.update({
            "key": key,
            "secret": secret,
            **configs,
            "test_model": _test_model(json.loads(configs["config_json"])),
        })
    response = render(request, "web/onboarding.html", context, status=status)
    response["Cache-Control"] = "no-store"  # the page may hold a secret
    return secret_forget(response, key_id=context["key"].pk, page=page) if "key" in context else response


def _own_key(request, key_id: str):
    """The signed-in user's key named by the page's ?key=, or 404 (a bad id is no one's key)."""
    if not key_id.isdigit() or int(key_id) >= 2**63:  # past a database id: no key, not a 500
        raise Http404("No such key.")
    try:
        return key_get_for_owner(key_id=int(key_id), user=request.user)
    except NotFound as exc:
        raise Http404(exc.message) from exc


@login_required
@require_GET
def onboarding_checklist_fragment(request):
    """The checklist alone, for the page's polling."""
    response = render(request, "web/_checklist.html", {"checklist": onboarding_checklist(user=request.user)})
    response["Cache-Control"] = "no-store"
    return response
