"""REST API for a tenant's judge rules — the personal tenant's at /api/judge-rules/, a group's at
/api/groups/<slug>/judge-rules/: every member may read them (they decide what counts as feedback on their
conversations); the service lets only the user, the group's owner and admins, and staff change them — and for
explicit feedback on one turn, /api/turns/<id>/feedback/ (a key needs the ``admin`` scope to rate here; the
key that served a turn rates it on /v1/feedback with ``inference``)."""

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.core.api import client_ip, openapi_error
from clawhub.core.exceptions import NotFound
from clawhub.core.openapi import NOT_SPACE, NUL
from clawhub.feedback.completion_ids import completion_id_for
from clawhub.feedback.models import ExplicitFeedback, JudgeRules
from clawhub.feedback.selectors import (
    explicit_feedback_for_turn,
    judge_rules_for_tenant,
    judgment_for_turn,
    turn_for_rating,
)
from clawhub.feedback.services import (
    COMMENT_MAX,
    DEMONSTRATION_MAX,
    MAX_HINT_CHARS,
    MAX_HINT_TEMPLATES,
    MAX_RULE_NAME_CHARS,
    feedback_submit,
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


# --- explicit feedback on a turn ----------------------------------------------------------------------------


class JudgeVerdictSerializer(serializers.Serializer):
    status = serializers.CharField(help_text='"ok", "failed", or "awaiting" (the judge has not run yet).')
    reward = serializers.IntegerField(help_text="The judge's own reward, -1, 0 or 1.")
    votes = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    hints = serializers.ListField(child=serializers.CharField())
    judge = serializers.CharField()


class FeedbackSampleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    reward = serializers.IntegerField(help_text="What training uses: the person's rating where there is one.")
    has_hint = serializers.BooleanField()
    flags = serializers.ListField(child=serializers.DictField(child=serializers.CharField()))
    training_run_id = serializers.IntegerField(allow_null=True)


class ExplicitFeedbackOutputSerializer(serializers.Serializer):
    turn = serializers.IntegerField(source="turn_id")
    completion_id = serializers.SerializerMethodField()
    thumb = serializers.CharField(allow_blank=True, help_text='"up", "down" or "" (none).')
    score = serializers.IntegerField(allow_null=True, help_text="1 (bad) to 5 (good).")
    comment = serializers.CharField(allow_blank=True)
    demonstration = serializers.CharField(allow_blank=True)
    reward = serializers.IntegerField(allow_null=True,
                                      help_text="-1, 0 or 1 from the thumb or score; null without either.")
    source = serializers.CharField()
    rated_by = serializers.EmailField(source="rated_by.email", allow_null=True, default=None)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    judge = serializers.SerializerMethodField()
    sample = serializers.SerializerMethodField()

    def get_completion_id(self, feedback) -> str:
        return completion_id_for(request_id=feedback.turn.request_id, route=feedback.turn.api)

    @extend_schema_field(JudgeVerdictSerializer(allow_null=True))
    def get_judge(self, feedback) -> dict | None:
        judgment = judgment_for_turn(turn_id=feedback.turn_id)
        return JudgeVerdictSerializer(judgment).data if judgment is not None else None

    @extend_schema_field(FeedbackSampleSerializer(allow_null=True))
    def get_sample(self, feedback) -> dict | None:
        from clawhub.review.models import Sample

        sample = Sample.objects.filter(turn_id=feedback.turn_id).first()
        return FeedbackSampleSerializer(sample).data if sample is not None else None


class TurnFeedbackInputSerializer(serializers.Serializer):
    """What a rating may say (named apart: the judge rules' input is "Input" too)."""

    thumb = serializers.ChoiceField(choices=ExplicitFeedback.Thumb.choices, required=False,
                                    allow_null=True, allow_blank=True)
    score = serializers.IntegerField(min_value=1, max_value=5, required=False, allow_null=True)
    comment = serializers.CharField(max_length=COMMENT_MAX, required=False, allow_blank=True,
                                    allow_null=True, trim_whitespace=True)
    demonstration = serializers.CharField(max_length=DEMONSTRATION_MAX, required=False, allow_blank=True,
                                          allow_null=True, trim_whitespace=True)


class TurnFeedbackDetailApi(APIView):
    """The explicit feedback on one turn (404 when it has none yet)."""

    @extend_schema(responses={200: ExplicitFeedbackOutputSerializer,
                              404: openapi_error("No such turn for the caller, or no feedback on it yet.")},
                   description=__doc__)
    def get(self, request: Request, turn_id: int) -> Response:
        turn = turn_for_rating(actor=request.user, turn_id=turn_id)
        feedback = explicit_feedback_for_turn(turn_id=turn.pk)
        if feedback is None:
            raise NotFound("This turn has no explicit feedback yet.", code="no_feedback")
        return Response(ExplicitFeedbackOutputSerializer(feedback).data)


class TurnFeedbackRateApi(APIView):
    """Rate a turn: thumb, 1–5 score, comment and/or corrected reply. Rating again updates it (fields left out
    keep their value, null clears one). Your own turns, and those of tenants you review. Rule across fields
    and the turn's earlier rating: the feedback after the change says something (a thumb, a score, a comment
    or a corrected reply that is not blank), or the request is refused (400 empty_feedback)."""

    InputSerializer = TurnFeedbackInputSerializer

    @extend_schema(request=InputSerializer,
                   responses={200: ExplicitFeedbackOutputSerializer, 201: ExplicitFeedbackOutputSerializer,
                              400: openapi_error("Invalid or empty feedback, or a side turn."),
                              404: openapi_error("No such turn for the caller."),
                              409: openapi_error("The turn has already gone to training (sample_trained).")},
                   description=__doc__)
    def post(self, request: Request, turn_id: int) -> Response:
        turn = turn_for_rating(actor=request.user, turn_id=turn_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = getattr(request.auth, "key", None)
        feedback, created = feedback_submit(actor=request.user, turn=turn, source=ExplicitFeedback.Source.API,
                                            key_id=key.pk if key else None, ip=client_ip(request),
                                            **data.validated_data)
        return Response(ExplicitFeedbackOutputSerializer(feedback).data, status=201 if created else 200)
