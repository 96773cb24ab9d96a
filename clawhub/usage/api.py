"""REST API for usage: GET /api/usage/ as JSON, or as CSV with ?format=csv."""

from datetime import timedelta

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from clawhub.core.api import openapi_error
from clawhub.tenants.access import group_access
from clawhub.usage.renderers import UsageCSVRenderer
from clawhub.usage.selectors import BY, usage_default_range, usage_scope, usage_summary, usage_totals

# A longer range is a different question (an export of everything); refuse it rather than scan for it.
MAX_RANGE = timedelta(days=400)


CSV_DESCRIPTION = (
    "JSON: the sums. CSV (`format=csv` or `Accept: text/csv`, sent as an attachment): one line per row of "
    "`results`, under a header of its columns: the `by` column(s) (day: day; model: model; key: key_id, "
    "key_name, key_prefix, key_last4; user: user_id, user_email; group: group_id, group_slug, group_name), "
    "then "
    "requests, errors, prompt_tokens, completion_tokens, total_tokens, streams, avg_latency_ms, avg_ttft_ms.")


class UsageOutputSerializer(serializers.Serializer):
    by = serializers.CharField()
    since = serializers.DateField()
    until = serializers.DateField()
    # Flat rows: the ``by`` column(s) (day: day; model: model; key: key_id, key_name, key_prefix, key_last4;
    # user: user_id, user_email; group: group_id, group_slug, group_name, empty for personal keys), then
    # requests, errors, prompt/completion/total tokens, streams, avg_latency_ms, avg_ttft_ms
    # (selectors.usage_columns). The same rows are the CSV's lines, under that header.
    results = serializers.ListField(child=serializers.DictField())
    totals = serializers.DictField()


class UsageApi(APIView):
    """Sums per ``by`` (day, model, key, user or group) over ``since``..``until`` (dates, inclusive).

    Scope: the caller's own usage; ``group=<slug>`` the group's (owners, admins and staff: everyone's in it,
    members: their own part); ``user=<id>`` one member (group owners/admins within their group, staff
    anywhere); ``all=true`` everyone (staff). ``key`` and ``model`` narrow further.
    """

    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, UsageCSVRenderer]

    class InputSerializer(serializers.Serializer):
        group = serializers.SlugField(required=False)
        user = serializers.IntegerField(required=False, min_value=1)
        all = serializers.BooleanField(required=False, default=False)
        key = serializers.IntegerField(required=False, min_value=1)
        model = serializers.CharField(required=False, max_length=100)
        since = serializers.DateField(required=False)
        until = serializers.DateField(required=False)
        by = serializers.ChoiceField(choices=BY, default="day")

        def validate(self, data):
            default_since, until = usage_default_range(until=data.get("until"))
            since = data.get("since") or default_since
            if since > until:
                raise serializers.ValidationError({"since": "must not be after until"})
            if until - since > MAX_RANGE:
                raise serializers.ValidationError({"since": f"the range is at most {MAX_RANGE.days} days"})
            return {**data, "since": since, "until": until}

    OutputSerializer = UsageOutputSerializer

    @extend_schema(
        parameters=[InputSerializer, OpenApiParameter(
            "format", str, enum=["json", "csv"],
            description="csv: the same rows as `results`, one line each under a header (errors too: "
                        "an `error,message` header and one line).")],
        responses={200: OpenApiResponse(OutputSerializer, description=CSV_DESCRIPTION),
                   404: openapi_error("No such group or user, or not one the caller may see usage of.")},
        description=(__doc__ or "") + " Rules across parameters: `since` is not after `until`, and the "
                    f"range is at most {MAX_RANGE.days} days (`until` defaults to today, `since` to 30 days "
                    "before it).",
    )
    def get(self, request):
        params = self.InputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        p = params.validated_data
        # The group is a query parameter, so it is resolved here, once the parameters are valid (a bad one is
        # 400 before any 404), by the same rule the other group APIs use, staff included.
        access = group_access(actor=request.user, slug=p["group"], staff=True) if p.get("group") else None
        scope = usage_scope(actor=request.user, access=access, user_id=p.get("user"), everything=p["all"])
        narrow = {"since": p["since"], "until": p["until"], "key_id": p.get("key"), "model": p.get("model")}
        results = usage_summary(scope=scope, by=p["by"], **narrow)
        body = {"by": p["by"], "since": p["since"], "until": p["until"], "results": results,
                "totals": usage_totals(scope=scope, **narrow)}
        response = Response(self.OutputSerializer(body).data)
        if request.accepted_renderer.format == UsageCSVRenderer.format:
            response["Content-Disposition"] = (
                f'attachment; filename="clawhub-usage-{p["by"]}-{p["since"]}-{p["until"]}.csv"')
        return response
