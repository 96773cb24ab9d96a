"""Server-rendered pages: a tenant's training (/training/…) and adapter versions (/adapters/…).

Every page resolves (tenant, actor, role) once, with the page decorators of ``clawhub.tenants.access``; forms
post to small views that call the same services as the REST API and come back with a message.
"""

import json

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from clawhub.adapters import selectors as adapter_selectors
from clawhub.adapters import services as adapter_services
from clawhub.adapters.selectors import tenants_for_user
from clawhub.core.api import client_ip
from clawhub.core.exceptions import ValidationFailed
from clawhub.core.views import page_errors, post_and_redirect
from clawhub.review.selectors import trainable_count, training_sources_for_tenant
from clawhub.tenants.access import tenant_page, tenant_row_page
from clawhub.tenants.selectors import tenant_label
from clawhub.training import selectors, services, settings_services
from clawhub.training.models import Backend, Method
from clawhub.training.progress import run_progress

# How often the run page asks for progress while something can still change.
POLL_SECONDS = 2.0

run_page = tenant_row_page(kwarg="run_id", name="run", get_row=lambda pk: selectors.run_get(run_id=pk),
                           not_found="No such training run.")
version_page = tenant_row_page(kwarg="version_id", name="version", not_found="No such adapter version.",
                               get_row=lambda pk: adapter_selectors.adapter_version_get(version_id=pk))


@login_required
@require_GET
def training_index(request):
    tenants = tenants_for_user(user=request.user)
    return render(
        request,
        "training/index.html",
        {
            "tenants": [
                (
                    t,
                    tenant_label(t),
                    selectors.open_run_for_tenant(tenant=t),
                    adapter_selectors.active_adapter_for_tenant(tenant_id=t.pk),
                )
                for t in tenants
            ],
        },
    )


@login_required
@require_GET
@page_errors
@tenant_page
def training_tenant(request, access):
    ts = selectors.training_settings_for(tenant=access.tenant)
    return render(
        request,
        "training/tenant.html",
        {
            "access": access,
            "label": tenant_label(access.tenant),
            "runs": selectors.runs_for_tenant(tenant=access.tenant)[:50],
            "settings": ts,
            "backend": selectors.backend_for(ts),
            "batch_size": selectors.batch_size_for(ts),
            "overrides": json.dumps(ts.overrides or {}),
            "trainable": trainable_count(tenant=access.tenant),
            # Fidelity at a glance: samples built from the ids vLLM served vs re-rendered, and why.
            "sources": training_sources_for_tenant(tenant_id=access.tenant.pk),
            "methods": Method.values,
            "backends": Backend.values,
            "live": _live(access.tenant),
            "poll_seconds": POLL_SECONDS,
        },
    )


def _live(tenant):
    """The progress of the tenant's open run, or of its latest run while that one's version is still on its
    way to being served (evaluating, promoting)."""
    run = selectors.open_run_for_tenant(tenant=tenant) or selectors.runs_for_tenant(tenant=tenant).first()
    if run is None:
        return None
    progress = run_progress(run=run)
    return None if progress["done"] and not run.is_open else progress


@login_required
@require_POST
@page_errors
@tenant_page
def training_start(request, access):
    return post_and_redirect(
        request,
        lambda: services.run_start(tenant=access.tenant, access=access, ip=client_ip(request)),
        "Training run started.",
        f"/training/{access.tenant.pk}/",
    )


@login_required
@require_POST
@page_errors
@tenant_page
def training_settings(request, access):

    def update():
        try:
            overrides = json.loads(request.POST.get("overrides") or "{}")
            batch_size = int(request.POST.get("batch_size") or 0)
        except ValueError:
            raise ValidationFailed("Overrides must be a JSON object and the batch size a number.") from None
        changes = {
            "method": request.POST.get("method") or None,
            "overrides": overrides,
            "batch_size": batch_size,
            "auto_start": request.POST.get("auto_start") == "on",
        }
        if "backend" in request.POST:
            changes["backend"] = request.POST["backend"]
        settings_services.training_settings_update(access=access, ip=client_ip(request), **changes)

    return post_and_redirect(request, update, "Training settings saved.", f"/training/{access.tenant.pk}/")


@login_required
@require_GET
@page_errors
@run_page
def run_detail(request, run, access):
    return render(
        request,
        "training/run.html",
        {
            "run": run,
            "access": access,
            "label": tenant_label(access.tenant),
            "config": json.dumps(run.config, indent=2),
            "remote_ids": json.dumps(run.remote_ids, indent=2),
            "progress": run_progress(run=run),
            "poll_seconds": POLL_SECONDS,
            "curves": _curves(run),
        },
    )


def _curves(run) -> list:
    """The run's loss and mean reward per step, from the metrics the trainer stored at each step."""
    from clawhub.core.charts import step_chart

    steps = [m.get("step", i) for i, m in enumerate(run.metrics or [])]
    charts = [step_chart(title="Loss per step (lower: the update fits the batch better)", steps=steps,
                         values=[m.get("loss") for m in run.metrics or []], y_label="loss"),
              step_chart(title="Mean reward per step (of the samples in the step)", steps=steps,
                         values=[m.get("mean_reward") for m in run.metrics or []], y_label="mean reward",
                         color="#009e73")]
    return [c for c in charts if c is not None]


@login_required
@require_GET
@page_errors
@run_page
def run_progress_json(request, run, access):
    """What the run page's poller reads: step, loss, samples, percent, and what happens next."""
    return JsonResponse(run_progress(run=run))


@login_required
@require_POST
@page_errors
@run_page
def run_cancel(request, run, access):
    return post_and_redirect(
        request,
        lambda: services.run_cancel(access=access, run=run, ip=client_ip(request)),
        "Training run cancelled; its samples are back in the pool.",
        f"/training/runs/{run.pk}/",
    )


@login_required
@require_GET
@page_errors
@tenant_page
def adapter_versions(request, access):
    versions = list(adapter_selectors.adapter_versions(tenant=access.tenant))
    scored = [v for v in reversed(versions) if v.eval_score is not None]
    return render(
        request,
        "adapters/versions.html",
        {
            "access": access,
            "label": tenant_label(access.tenant),
            "versions": versions,
            "pin": adapter_selectors.adapter_pin_for(tenant=access.tenant),
            # Scores over time, oldest first, as bars scaled from -1..+1 to 0..100 %.
            "chart": [(v.version, v.eval_score, round((v.eval_score + 1) * 50)) for v in scored],
        },
    )


@login_required
@require_POST
@page_errors
@version_page
def adapter_rollback(request, version, access):
    return post_and_redirect(
        request,
        lambda: adapter_services.adapter_rollback(access=access, version=version, ip=client_ip(request)),
        f"Rolling back to version {version.version}; it is served as soon as it is loaded.",
        f"/adapters/{version.tenant_id}/",
    )


@login_required
@require_POST
@page_errors
@tenant_page
def adapter_pin(request, access):
    if request.POST.get("unpin"):
        return post_and_redirect(
            request,
            lambda: adapter_services.adapter_unpin(access=access, ip=client_ip(request)),
            "Unpinned: new versions are promoted when they pass the eval gate.",
            f"/adapters/{access.tenant.pk}/",
        )
    return post_and_redirect(
        request,
        lambda: adapter_services.adapter_pin(
            access=access, reason=request.POST.get("reason", ""), ip=client_ip(request)
        ),
        "Pinned to the active version.",
        f"/adapters/{access.tenant.pk}/",
    )
