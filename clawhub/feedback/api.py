"""REST API for a tenant's judge rules — the personal tenant's at /api/judge-rules/, a group's at
/api/groups/<slug>/judge-rules/: every member may read them (they decide what counts as feedback on their
conversations); the service lets only the user, the group's owner and admins, and staff change them. A
person's rating of one turn is ``clawhub.review.api`` (it changes the turn's sample)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.core.api import client_ip
from clawhub.core.openapi import NOT_SPACE, NUL
from clawhub.feedback.models import JudgeRules
from clawhub.feedback.selectors import (
    judge_rules_for_tenant,
)
from clawhub.feedback.services import (
    MAX_HINT_CHARS,
    MAX_HINT_TEMPLATES,
    MAX_RULE_NAME_CHARS,
    judge_rules_set,
)
from clawhub.tenants.access import group_access
from clawhub.tenants.models import Tenant
from clawhub.tenants.selectors import tenant_for_user
from workers.judge.judges import (
    DEFAULT_HINTS,
    DEFAULT_NEGATIVE,
    DEFAULT_POSITIVE,
    MAX_PATTERN_CHARS,
    MAX_TENANT_RULES,
)

# One tenant rule, as workers.judge.judges.compile_rule reads it. Any RE2 pattern is allowed after "re:" (and
# in {"pattern", "regex": true}); the schema's own patterns admit only the ones that always compile. No text
# in a rule may hold a NUL (PostgreSQL's JSON cannot store one), and a phrase needs a character that is not
# whitespace (the judge strips it).
_PLAIN = r"^[A-Za-z0-9 ]*[A-Za-z0-9][A-Za-z0-9 ]*$"
_TEXT = {"type": "string", "not": {"pattern": NUL}}
RULE_SCHEMA = {"anyOf": [
    {**_TEXT, "maxLength": MAX_PATTERN_CHARS, "pattern": r"^(?!re:)[\s\S]*" + NOT_SPACE,
     "description": "A phrase: whole words, any whitespace between them, case-insensitive."},
    {**_TEXT, "maxLength": MAX_PATTERN_CHARS + 3, "pattern": "^re:" + _PLAIN[1:],
     "description": "re:<pattern>: an RE2 regular expression (no backreferences or lookaround)."},
    {"type": "object", "required": ["pattern"], "additionalProperties": False, "properties": {
        "name": {**_TEXT, "maxLength": MAX_RULE_NAME_CHARS},
        "pattern": {**_TEXT, "maxLength": MAX_PATTERN_CHARS, "pattern": _PLAIN},
        "regex": {"type": "boolean", "default": True}}},
]}
RULES_SCHEMA = {"items": RULE_SCHEMA, "maxItems": MAX_TENANT_RULES}


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
        return group_access(actor=request.user, slug=slug).tenant

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
                                                  max_length=200, style={"openapi": RULES_SCHEMA})
        positive_patterns = serializers.ListField(child=serializers.JSONField(), required=False,
                                                  max_length=200, style={"openapi": RULES_SCHEMA})
        hint_templates = serializers.DictField(
            child=serializers.CharField(max_length=MAX_HINT_CHARS), required=False, style={"openapi": {
                "maxProperties": MAX_HINT_TEMPLATES,
                # OpenAPI 3.0 has no propertyNames: the rule on the names is said in words.
                "description": f"Rule name -> hint. A name has at most {MAX_RULE_NAME_CHARS} characters "
                               "and no NUL."}})
        extend_defaults = serializers.BooleanField(required=False)

        class Meta:
            ref_name = "JudgeRulesInput"

    @extend_schema(request=InputSerializer, responses=JudgeRulesOutputSerializer)
    def put(self, request: Request, slug: str | None = None) -> Response:
        tenant = self.tenant(request, slug)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        judge_rules_set(tenant=tenant, actor=request.user, ip=client_ip(request), **data.validated_data)
        return self.respond(tenant)
