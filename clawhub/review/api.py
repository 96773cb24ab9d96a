"""REST API: the review console's actions (/api/review/…), and explicit feedback on one turn,
/api/turns/<id>/feedback/ (a key needs the ``admin`` scope to rate here; the key that served a turn rates
it on /v1/feedback with ``inference``). Users' own data (/api/me/…) is ``clawhub.privacy.api``."""

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.conversations.selectors import turn_request
from clawhub.core.api import PAGE_PARAMETERS, Pagination, QueryChoiceField, client_ip, openapi_error, page_of
from clawhub.core.exceptions import NotFound
from clawhub.core.openapi import NOT_SPACE
from clawhub.feedback.completion_ids import completion_id_for
from clawhub.feedback.models import ExplicitFeedback
from clawhub.feedback.selectors import explicit_feedback_for_turn, judgment_for_turn, turn_for_rating
from clawhub.review import flags, selectors, services
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.review.services import COMMENT_MAX, DEMONSTRATION_MAX, feedback_submit
from clawhub.tenants.access import (
    TenantAccess,
    TenantApi,
    TenantRowApi,
    review_access_by_id,
    review_access_for_row,
    review_access_for_tenants,
)

# --- OpenAPI description ------------------------------------------------------------------------------------
REVIEW_TAGS = ["review"]
INVALID = openapi_error("Invalid input; data.field or data.fields names the field.")
# Members and viewers of the sample's group know it exists: 403. Anyone else: 404, so nothing leaks.
FORBIDDEN = openapi_error("The caller is a member of the group but not its owner or an admin.")
NOT_FOUND = openapi_error("No such sample (or tenant), or not one the caller reviews.")
CONFLICT = openapi_error("The sample was deleted by its user (sample_deleted) or has gone to training "
                         "(sample_trained).")
REVIEW_ERRORS = {400: INVALID, 403: FORBIDDEN, 404: NOT_FOUND}


_page_of = page_of


class SamplePagination(Pagination):
    page_size = 50
    max_page_size = 500


class TenantOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    label = serializers.SerializerMethodField()

    def get_label(self, tenant) -> str:
        return selectors.tenant_label(tenant)


class SampleOutputSerializer(serializers.Serializer):
    """A sample as reviewers see it."""

    id = serializers.IntegerField()
    tenant = TenantOutputSerializer()
    user = serializers.SerializerMethodField()
    key = serializers.SerializerMethodField()
    turn_id = serializers.IntegerField()
    reward = serializers.IntegerField()
    has_hint = serializers.BooleanField()
    state = serializers.CharField()
    flags = serializers.JSONField()
    decided_by = serializers.SerializerMethodField()
    decided_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField()
    trained = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_user(self, sample) -> dict:
        return {"id": sample.user_id, "email": sample.user.email}

    def get_key(self, sample) -> dict | None:
        if sample.key is None:
            return None
        return {"id": sample.key.pk, "name": sample.key.name, "display": sample.key.display}

    def get_decided_by(self, sample) -> dict | None:
        return {"id": sample.decided_by_id, "email": sample.decided_by.email} if sample.decided_by else None

    def get_trained(self, sample) -> bool:
        return sample.trained_at is not None


class SampleDetailOutputSerializer(SampleOutputSerializer):
    """Adds what the reviewer needs to judge the judge: the conversation, the response, what came next."""

    messages = serializers.SerializerMethodField()
    tools = serializers.SerializerMethodField()
    response = serializers.SerializerMethodField()
    next_state = serializers.SerializerMethodField()
    votes = serializers.SerializerMethodField()
    raw_votes = serializers.SerializerMethodField()
    hints = serializers.SerializerMethodField()
    judge = serializers.SerializerMethodField()

    def get_messages(self, sample) -> list:
        return turn_request(turn=sample.turn).get("messages") or []  # rebuilt from what each turn added

    def get_tools(self, sample) -> list:
        return (sample.turn.request or {}).get("tools") or []

    def get_response(self, sample) -> list:
        return sample.turn.response or []

    def get_next_state(self, sample) -> list | None:
        return sample.turn.next_state

    def get_votes(self, sample) -> list:
        return sample.judgment.votes or []

    def get_raw_votes(self, sample) -> list:
        return (sample.judgment.raw_outputs or {}).get("prm") or []

    def get_hints(self, sample) -> list:
        return sample.judgment.hints or []

    def get_judge(self, sample) -> dict:
        return {"name": sample.judgment.judge, "prompt_version": sample.judgment.prompt_version}


class SampleListApi(APIView):
    """The samples the caller reviews, newest first: every tenant for site staff, their groups for group
    owners and admins, and everyone's own personal tenant."""

    class FilterSerializer(serializers.Serializer):
        # Checked by selectors.samples_for_review; described here as it checks them.
        tenant = serializers.CharField(required=False, allow_blank=True, default="",
                                       help_text="A tenant id the caller reviews (403/404 otherwise).",
                                       style={"openapi": {"pattern": r"^[0-9]*$"}})
        flag = serializers.ChoiceField(choices=["", *flags.CODES, "any", "none"], required=False, default="")
        reward = serializers.CharField(required=False, allow_blank=True, default="",
                                       style={"openapi": {"pattern": r"^(-?[0-9]+)?$"}})
        state = QueryChoiceField(choices=Sample.State.values, required=False)

        class Meta:
            ref_name = "SampleListFilter"

    @extend_schema(tags=REVIEW_TAGS, operation_id="review_samples_list",
                   parameters=[FilterSerializer, *PAGE_PARAMETERS],
                   responses={200: _page_of("ReviewSamplePage", SampleOutputSerializer(many=True)),
                              **REVIEW_ERRORS})
    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        samples = selectors.samples_for_review(actor=request.user, tenant_id=f["tenant"], flag=f["flag"],
                                               reward=f["reward"], state=f.get("state", ""))
        paginator = SamplePagination()
        page = paginator.paginate_queryset(samples, request, view=self)
        return paginator.get_paginated_response(SampleOutputSerializer(page, many=True).data)


class SampleDetailApi(TenantRowApi):
    row_kwarg, row_name, not_found = "sample_id", "sample", "No such sample."
    row_access = staticmethod(review_access_for_row)

    def get_row(self, pk: int) -> Sample | None:
        return selectors.sample_for_review(sample_id=pk)

    @extend_schema(tags=REVIEW_TAGS, operation_id="review_samples_retrieve",
                   responses={200: SampleDetailOutputSerializer, 403: FORBIDDEN, 404: NOT_FOUND})
    def get(self, request, sample: Sample, access: TenantAccess):
        return Response(SampleDetailOutputSerializer(sample).data)


# What approving or rejecting one sample answers.
DECISION_RESPONSES = {200: SampleOutputSerializer, 409: CONFLICT, **REVIEW_ERRORS}


class SampleDecisionApi(TenantRowApi):
    # A decision on one sample: the caller's review access to its tenant is resolved before the handler
    # (members and viewers 403, anyone else 404, like a missing sample); the service takes it.
    row_kwarg, row_name, not_found = "sample_id", "sample", "No such sample."
    row_access = staticmethod(review_access_for_row)

    def get_row(self, pk: int) -> Sample | None:
        return selectors.sample_for_decision(sample_id=pk)

    def decide(self, decision, request, sample: Sample, access: TenantAccess) -> Response:
        """The body checked by the view's InputSerializer, then ``decision`` (the service) as the caller."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        sample = decision(access=access, sample_id=sample.pk, ip=client_ip(request), **data.validated_data)
        return Response(SampleOutputSerializer(sample).data)


class SampleApproveApi(SampleDecisionApi):
    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)

        class Meta:
            ref_name = "SampleApproveInput"

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer, responses=DECISION_RESPONSES)
    def post(self, request, sample: Sample, access: TenantAccess):
        return self.decide(services.sample_approve, request, sample, access)


class SampleRejectApi(SampleDecisionApi):
    class InputSerializer(serializers.Serializer):
        # The service says why a reason is needed too (bulk rejections and the web console go through it).
        reason = serializers.CharField(max_length=2000, help_text="Why the sample is rejected (required).")

        class Meta:
            ref_name = "SampleRejectInput"

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer, responses=DECISION_RESPONSES)
    def post(self, request, sample: Sample, access: TenantAccess):
        return self.decide(services.sample_reject, request, sample, access)


class SampleBulkApi(APIView):
    class InputSerializer(serializers.Serializer):
        ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
                                    allow_empty=False, max_length=services.BULK_MAX,
                                    style={"openapi": {"minItems": 1}})
        action = serializers.ChoiceField(choices=["approve", "reject"])
        reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000,
                                       help_text="Required (not blank) to reject.")

        class Meta:
            ref_name = "SampleBulkInput"
            # A rejection needs a reason; an approval may have one.
            openapi = {"anyOf": [
                {"properties": {"action": {"pattern": "^approve$"}}},
                {"required": ["reason"], "properties": {"reason": {"pattern": NOT_SPACE}}},
            ]}

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer, responses={
        200: inline_serializer(name="ReviewBulkOutput", fields={
            "count": serializers.IntegerField(), "results": SampleOutputSerializer(many=True)}),
        409: CONFLICT, **REVIEW_ERRORS})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        accesses = review_access_for_tenants(actor=request.user,
                                             tenants=selectors.sample_tenants(sample_ids=v["ids"]))
        samples = services.samples_bulk_decide(accesses=accesses, sample_ids=v["ids"], action=v["action"],
                                               reason=v["reason"], ip=client_ip(request))
        return Response({"count": len(samples), "results": SampleOutputSerializer(samples, many=True).data})


class ReviewPolicyApi(TenantApi):
    access_by_id = staticmethod(review_access_by_id)

    class InputSerializer(serializers.Serializer):
        mode = serializers.ChoiceField(choices=ReviewPolicy.Mode.choices)

        class Meta:
            ref_name = "ReviewPolicyInput"

    class OutputSerializer(serializers.Serializer):
        tenant = serializers.IntegerField(source="tenant_id")
        mode = serializers.CharField()

        class Meta:
            ref_name = "ReviewPolicyOutput"

    @extend_schema(tags=REVIEW_TAGS, responses={200: OutputSerializer, 403: FORBIDDEN, 404: NOT_FOUND})
    def get(self, request, access: TenantAccess):
        return Response(self.OutputSerializer(selectors.review_policy_for(tenant=access.tenant)).data)

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer,
                   responses={200: OutputSerializer, **REVIEW_ERRORS})
    def patch(self, request, access: TenantAccess):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        policy = services.review_policy_set(access=access, mode=data.validated_data["mode"],
                                            ip=client_ip(request))
        return Response(self.OutputSerializer(policy).data)


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

    class Meta:
        # A thumb and a score in one request must agree (clawhub.review.services._disagree); with the stored
        # feedback's, a disagreement is a 409.
        openapi = {"not": {"anyOf": [
            {"required": ["thumb", "score"], "properties": {
                "thumb": {"enum": ["up"]}, "score": {"type": "integer", "maximum": 2}}},
            {"required": ["thumb", "score"], "properties": {
                "thumb": {"enum": ["down"]}, "score": {"type": "integer", "minimum": 4}}},
        ]}}


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
