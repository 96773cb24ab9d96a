"""Server-rendered pages: the user's privacy page (/privacy/): their switches, their samples, the export and
deleting the account."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clawhub.accounts.services import user_logout
from clawhub.core.api import client_ip
from clawhub.core.exceptions import ClawHubError
from clawhub.core.views import page_errors
from clawhub.keys.selectors import keys_for_user
from clawhub.privacy import selectors, services


@login_required
@require_GET
def privacy(request):
    samples = Paginator(selectors.samples_for_user(user=request.user), 50).get_page(request.GET.get("page"))
    return render(request, "privacy/privacy.html", {
        "keys": keys_for_user(user=request.user),
        "samples": samples,
    })


@login_required
@require_POST
def privacy_switches(request):
    services.privacy_update(actor=request.user, training_enabled=request.POST.get("training_enabled") == "on",
                            store_turns=request.POST.get("store_turns") == "on", ip=client_ip(request))
    messages.success(request, "Your privacy settings are saved.")
    return redirect("privacy")


@login_required
@require_POST
@page_errors
def privacy_key(request, key_id: int):
    key = services.key_training_set(actor=request.user, key_id=key_id,
                                    training_enabled=request.POST.get("training_enabled") == "on",
                                    ip=client_ip(request))
    messages.success(request, f"Training {'on' if key.training_enabled else 'off'} for key {key.name}.")
    return redirect("privacy")


@login_required
@require_http_methods(["GET", "POST"])
@page_errors
def privacy_sample_delete(request, sample_id: int):
    """GET: a page that says what deleting the sample does and asks to confirm; its form's POST (with
    ``confirm=yes``) deletes. A POST without it changes nothing and is sent to that page."""
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        sample = selectors.samples_for_user(user=request.user).filter(pk=sample_id).first()
        if sample is None:
            raise Http404("No such sample of yours.")
        if request.method == "POST":
            return redirect("privacy_sample_delete", sample_id=sample.pk)
        return render(request, "privacy/sample_delete.html", {"sample": sample})
    services.sample_delete_own(actor=request.user, sample_id=sample_id, ip=client_ip(request))
    messages.success(request, f"Sample {sample_id} deleted: it will never be used for training again.")
    return redirect("privacy")


@login_required
@require_GET
def privacy_export(request):
    body = json.dumps(selectors.user_data_export(user=request.user), cls=DjangoJSONEncoder, indent=2)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = 'attachment; filename="clawhub-export.json"'
    return response


@login_required
@require_POST
def privacy_delete_account(request):
    try:
        report = services.account_delete(actor=request.user, password=request.POST.get("password", ""),
                                         ip=client_ip(request))
    except ClawHubError as exc:
        messages.error(request, exc.message)
        return redirect("privacy")
    user_logout(request=request)
    messages.success(request, services.deletion_summary(report))
    return redirect("login")
