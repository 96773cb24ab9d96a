"""Server-rendered pages: the review console (/review/). The privacy page is ``clawhub.privacy.views``."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_POST

from clawhub.conversations.selectors import turn_request
from clawhub.core.api import client_ip
from clawhub.core.exceptions import ClawHubError, NotFound, PermissionDenied
from clawhub.core.views import page_errors, post_and_redirect
from clawhub.feedback.selectors import explicit_feedback_for_turn
from clawhub.review import flags, selectors, services
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.tenants.access import (
    review_access_by_id,
    review_access_for_row,
    review_access_for_tenants,
    tenant_page,
    tenant_row_page,
)


def _sample_page(get_sample):
    """A page about one sample (the view takes ``sample`` and ``access``), read with ``get_sample``."""
    return tenant_row_page(kwarg="sample_id", name="sample", not_found="No such sample.",
                           get_row=lambda pk: get_sample(sample_id=pk), row_access=review_access_for_row)


def _back(request, default: str) -> str:
    target = request.POST.get("next") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return target
    return default


# --- review console -----------------------------------------------------------------------------------------


@login_required
@require_GET
@page_errors
def review_list(request):
    filters = {name: request.GET.get(name, "") for name in ("tenant", "flag", "reward", "state")}
    if "state" not in request.GET:
        filters["state"] = Sample.State.PENDING  # the queue: what waits for a human
    try:
        samples = selectors.samples_for_review(actor=request.user, tenant_id=filters["tenant"],
                                               flag=filters["flag"], reward=filters["reward"],
                                               state=filters["state"])
    except ClawHubError as exc:
        if isinstance(exc, NotFound | PermissionDenied):
            raise
        messages.error(request, exc.message)
        samples = Sample.objects.none()
    page = Paginator(samples.select_related("turn"), 50).get_page(request.GET.get("page"))
    _with_feedback(list(page.object_list))
    tenants = list(selectors.reviewable_tenants(actor=request.user))
    # Kept on every link, the state too: "Any" (empty) must not fall back to the pending queue on page 2.
    query = urlencode({k: v for k, v in filters.items() if v or k == "state"})
    return render(request, "review/list.html", {
        "page": page,
        "filters": filters,
        "tenants": [(t.pk, selectors.tenant_label(t)) for t in tenants],
        "flag_codes": flags.CODES,
        "states": Sample.State.values,
        "query": query,
        "here": request.get_full_path(),
        "policies": [(t, selectors.review_policy_for(tenant=t)) for t in tenants],
        "modes": ReviewPolicy.Mode.values,
    })


def _with_feedback(samples: list[Sample]) -> None:
    """What the person said, for each sample on the page: their own rating if any, else their next message."""
    from clawhub.feedback.models import ExplicitFeedback

    turn_ids = [s.turn_id for s in samples]
    explicit = {f.turn_id: f for f in ExplicitFeedback.objects.filter(turn_id__in=turn_ids)}
    for sample in samples:
        sample.explicit = explicit.get(sample.turn_id)
        sample.next_text = services.next_state_text(sample.turn.next_state)


@login_required
@require_GET
@page_errors
@_sample_page(selectors.sample_for_review)
def review_detail(request, sample, access):
    turn, judgment = sample.turn, sample.judgment
    return render(request, "review/detail.html", {
        "sample": sample,
        "tenant_label": selectors.tenant_label(sample.tenant),
        "messages_in": _pretty_messages(turn_request(turn=turn).get("messages") or []),
        "tools": (turn.request or {}).get("tools") or [],
        "response": _pretty_messages([c.get("message") or c for c in turn.response or []
                                      if isinstance(c, dict)]),
        "next_state": _pretty_messages(turn.next_state or []),
        "votes": _votes(judgment),
        "hints": judgment.hints or [],
        "judgment": judgment,
        "explicit": explicit_feedback_for_turn(turn_id=turn.pk),
    })


def _votes(judgment) -> list[dict]:
    """Each vote's score beside the judge's raw answer it was parsed from."""
    raw = (judgment.raw_outputs or {}).get("prm") or []
    votes = []
    for i, vote in enumerate(judgment.votes or []):
        score = vote.get("score") if isinstance(vote, dict) else vote
        text = vote.get("raw") if isinstance(vote, dict) else (raw[i] if i < len(raw) else "")
        votes.append({"score": score, "raw": text or ""})
    return votes


def _pretty_messages(items) -> list[dict]:
    """Messages for the template: role, text, and tool calls as indented JSON."""
    out = []
    for m in items if isinstance(items, list) else [items]:
        if not isinstance(m, dict):
            out.append({"role": "", "text": str(m), "tool_calls": ""})
            continue
        content = m.get("content")
        text = content if isinstance(content, str) else (json.dumps(content, indent=2) if content else "")
        calls = m.get("tool_calls")
        out.append({"role": m.get("role", ""), "text": text,
                    "name": m.get("name") or m.get("tool_call_id", ""),
                    "tool_calls": json.dumps(calls, indent=2) if calls else ""})
    return out


@login_required
@require_POST
@page_errors
@_sample_page(selectors.sample_for_decision)
def review_decide(request, sample, access):
    action, reason = request.POST.get("action", ""), request.POST.get("reason", "")
    decide = services.sample_reject if action == "reject" else services.sample_approve
    return post_and_redirect(
        request,
        lambda: decide(access=access, sample_id=sample.pk, reason=reason, ip=client_ip(request)),
        f"Sample {sample.pk} {'rejected' if action == 'reject' else 'approved'}.",
        _back(request, reverse("review_sample", args=[sample.pk])),
    )


@login_required
@require_POST
@page_errors
def review_bulk(request):
    ids = [int(i) for i in request.POST.getlist("ids") if i.isdigit()]
    action = request.POST.get("action", "")
    accesses = review_access_for_tenants(actor=request.user, tenants=selectors.sample_tenants(sample_ids=ids))
    return post_and_redirect(
        request,
        lambda: services.samples_bulk_decide(accesses=accesses, sample_ids=ids, action=action,
                                             reason=request.POST.get("reason", ""), ip=client_ip(request)),
        lambda done: f"{len(done)} samples {'rejected' if action == 'reject' else 'approved'}.",
        _back(request, reverse("review")),
    )


@login_required
@require_POST
@page_errors
@tenant_page(access_by_id=review_access_by_id)
def review_policy(request, access):
    tenant = access.tenant
    try:
        services.review_policy_set(access=access, mode=request.POST.get("mode", ""), ip=client_ip(request))
    except ClawHubError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Review mode of {selectors.tenant_label(tenant)} saved.")
    return redirect(_back(request, reverse("review")))
