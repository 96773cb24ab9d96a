from django.contrib.auth.decorators import login_required
from django.http import HttpResponsePermanentRedirect
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET

from clawhub.core.views import page_errors
from clawhub.tenants.access import tenant_page


def home(request):
    if request.user.is_authenticated:
        return redirect("dashboard")
    return render(request, "web/home.html")


@require_GET
def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links to; send them to the icon the pages name."""
    return HttpResponsePermanentRedirect(static("clawhub/favicon.svg"))


@login_required
def dashboard(request):
    from clawhub.groups.selectors import groups_for_user
    from clawhub.keys.selectors import keys_for_user
    from clawhub.web.progress import adapter_progress, bench_plot_data_uri

    return render(request, "web/dashboard.html", {
        "keys": keys_for_user(user=request.user)[:10],
        "groups": groups_for_user(user=request.user),
        "progress": adapter_progress(user=request.user),
        "bench_plot": bench_plot_data_uri(),
    })


@login_required
@require_GET
def learning_index(request):
    """The learning page of the user's own adapter (the others are a click away on it)."""
    return redirect("learning", tenant_id=request.user.tenant.pk)


@login_required
@require_GET
@page_errors
@tenant_page
def learning(request, access):
    """"Is my model getting better?": the gate's metric per version, judged turns per day, the timeline."""
    from clawhub.adapters.selectors import tenants_for_user
    from clawhub.feedback.selectors import judge_name_for_tenant
    from clawhub.tenants.selectors import tenant_label
    from clawhub.web.learning import learning_for_tenant

    return render(request, "web/learning.html", {
        "access": access,
        "judge": judge_name_for_tenant(tenant_id=access.tenant.pk),
        "label": tenant_label(access.tenant),
        "learning": learning_for_tenant(tenant=access.tenant),
        "tenants": [(t, tenant_label(t)) for t in tenants_for_user(user=request.user)],
    })
