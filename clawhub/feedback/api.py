"""REST API for a tenant's judge rules: the personal tenant's at /api/judge-rules/, a group's at
/api/groups/<slug>/judge-rules/. Every member may read them (they decide what counts as feedback on their
conversations); the service lets only the user, the group's owner and admins, and staff change them."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.core.api import client_ip
from clawhub.feedback.models import JudgeRules
from clawhub.feedback.selectors import judge_rules_for_tenant
from clawhub.feedback.services import judge_rules_set
from clawhub.groups.selectors import group_get_for_member
from clawhub.tenants.models import Tenant
from clawhub.tenants.selectors import tenant_for_group, tenant_for_user
from workers.judge.judges import DEFAULT_HINTS, DEFAULT_NEGATIVE, DEFAULT_POSITIVE


class JudgeRulesOutputSerializer(serializers.Serializer):
    judge = serializers.CharField()
    negative_patterns = serializers.JSONField()
    positive_patterns = serializers.JSONField()
    hint_templates = serializers.JSONField()
    extend_defaults = serializers.BooleanField()
    updated_at = serializers.DateTimeField(allow_null=True)
    defaults = serializers.SerializerMethodField()

    def get_defaults(self, rules) -> dict:
        return {"negative_patterns": list(DEFAULT_NEGATIVE), "positive_patterns": list(DEFAULT_POSITIVE),
                "hint_templates": DEFAULT_HINTS}


class TenantJudgeRulesApi(APIView):
    def tenant(self, request: Request, slug: str | None) -> Tenant:
        if slug is None:
            return tenant_for_user(user=request.user)
        group, _role = group_get_for_member(slug=slug, user=request.user)
        return tenant_for_group(group=group)

    def respond(self, tenant: Tenant) -> Response:
        # A tenant that never set rules reads as the defaults, without a row being written for it.
        rules = judge_rules_for_tenant(tenant_id=tenant.pk) or JudgeRules(tenant=tenant, updated_at=None)
        return Response(JudgeRulesOutputSerializer(rules).data)


class JudgeRulesDetailApi(TenantJudgeRulesApi):
    """The judge rules of the caller's personal tenant or of one of their groups, with the built-in ones."""

    @extend_schema(responses=JudgeRulesOutputSerializer)
    def get(self, request: Request, slug: str | None = None) -> Response:
        return self.respond(self.tenant(request, slug))


class JudgeRulesUpdateApi(TenantJudgeRulesApi):
    """Change the judge rules (fields left out keep their value)."""

    class InputSerializer(serializers.Serializer):
        judge = serializers.ChoiceField(choices=JudgeRules.Backend.choices, required=False)
        negative_patterns = serializers.ListField(child=serializers.JSONField(), required=False,
                                                  max_length=200)
        positive_patterns = serializers.ListField(child=serializers.JSONField(), required=False,
                                                  max_length=200)
        hint_templates = serializers.DictField(child=serializers.CharField(max_length=1000), required=False)
        extend_defaults = serializers.BooleanField(required=False)

    @extend_schema(request=InputSerializer, responses=JudgeRulesOutputSerializer)
    def put(self, request: Request, slug: str | None = None) -> Response:
        tenant = self.tenant(request, slug)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        judge_rules_set(tenant=tenant, actor=request.user, ip=client_ip(request), **data.validated_data)
        return self.respond(tenant)
