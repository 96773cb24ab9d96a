"""The "connect OpenClaw" page a new user lands on after signing up: create a key, copy the OpenClaw config or
the onboard commands, send a test request through the gateway, and watch a checklist tick itself.

The secret exists only in the response to the POST that creates the key (as on the key pages): it is never put
in the session, a cache or the database. The test request is made by the browser from that page, straight to
this site's /v1 with the secret the page already shows, so the server needs the secret nowhere else.
"""

import json

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_http_methods

from clawhub.core.api import client_ip
from clawhub.core.exceptions import ClawHubError
from clawhub.keys.claude_code import claude_code_env
from clawhub.keys.openclaw import PROVIDER_ID, openclaw_config_json, openclaw_onboard_command
from clawhub.keys.selectors import keys_for_user
from clawhub.keys.services import key_create
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
    status = 200
    if request.method == "POST":
        try:
            key, secret = key_create(owner=request.user, name=KEY_NAME, ip=client_ip(request))
        except ClawHubError as exc:
            context["error"], status = exc.message, exc.status
        else:
            config_json = openclaw_config_json(key=key, secret=secret)
            context.update({
                "key": key,
                "secret": secret,
                "config_json": config_json,
                "onboard_command": openclaw_onboard_command(key=key, secret=secret),
                "claude_code_env": claude_code_env(key=key, secret=secret),
                "test_model": _test_model(json.loads(config_json)),
                "checklist": onboarding_checklist(user=request.user),
            })
    response = render(request, "web/onboarding.html", context, status=status)
    response["Cache-Control"] = "no-store"  # the page may hold a secret
    return response


@login_required
@require_GET
def onboarding_checklist_fragment(request):
    """The checklist alone, for the page's polling."""
    response = render(request, "web/_checklist.html", {"checklist": onboarding_checklist(user=request.user)})
    response["Cache-Control"] = "no-store"
    return response
