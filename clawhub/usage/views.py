"""The usage page: the user's own usage by day, model and key, and for each group they own or administer, the
group's usage by member and model; each as two charts (requests with errors, tokens) above its table."""

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode

from clawhub.groups.models import Role
from clawhub.groups.selectors import groups_for_user
from clawhub.tenants.access import group_access
from clawhub.usage.charts import usage_charts
from clawhub.usage.selectors import usage_default_range, usage_scope, usage_summary, usage_totals


class RangeForm(forms.Form):
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))


def _range(request: HttpRequest) -> tuple[RangeForm, dict]:
    form = RangeForm(request.GET or None)
    data = form.cleaned_data if form.is_valid() else {}
    since, until = usage_default_range(until=data.get("until"))
    since = data.get("since") or since
    if since > until:
        since = until
    return form, {"since": since, "until": until}


NOUNS = {"day": "day", "model": "model", "key": "key", "user": "member", "group": "group"}


def _summary(scope, dates: dict, *by: str) -> dict:
    summary: dict = {"totals": usage_totals(scope=scope, **dates)}
    for name in by:
        rows = usage_summary(scope=scope, by=name, **dates)
        summary[f"by_{name}"] = rows
        summary[f"charts_{name}"] = usage_charts(rows=rows, by=name, noun=NOUNS[name], **dates)
    return summary


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    form, dates = _range(request)
    mine = _summary(usage_scope(actor=request.user), dates, "day", "model", "key")
    groups = []
    for group in groups_for_user(user=request.user, at_least=Role.ADMIN):
        access = group_access(actor=request.user, slug=group.slug, staff=True)  # as the usage API resolves it
        groups.append({"group": group, **_summary(usage_scope(actor=request.user, access=access), dates,
                                                  "user", "model")})
    query = {"since": dates["since"].isoformat(), "until": dates["until"].isoformat(), "format": "csv"}
    csv = {by: f"{reverse('api-usage')}?{urlencode({**query, 'by': by})}" for by in ("day", "model", "key")}
    return render(request, "usage/usage.html", {
        "form": form, **dates, "mine": mine, "groups": groups, "csv": csv,
    })
