"""REST API: the review console's actions (/api/review/…) and users' own data (/api/me/…)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.accounts.services import user_logout
from clawhub.conversations.selectors import turn_request
from clawhub.core.api import PAGE_PARAMETERS, client_ip, openapi_error, page_of
from clawhub.keys.selectors import keys_for_user
from clawhub.review import flags, selectors, services
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.tenants.models import Tenant

# --- OpenAPI description ------------------------------------------------------------------------------------
REVIEW_TAGS, ME_TAGS = ["review"], ["privacy"]
INVALID = openapi_error("Invalid input; data.field or data.fields names the field.")
# Members and viewers of the sample's group know it exists: 403. Anyone else: 404, so nothing leaks.
FORBIDDEN = openapi_error("The caller is a member of the group but not its owner or an admin.")
NOT_FOUND = openapi_error("No such sample (or tenant), or not one the caller reviews.")
CONFLICT = openapi_error("The sample was deleted by its user (sample_deleted) or has gone to training "
                         "(sample_trained).")
REVIEW_ERRORS = {400: INVALID, 403: FORBIDDEN, 404: NOT_FOUND}


_page_of = page_of


class SamplePagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
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
        state = serializers.ChoiceField(choices=["", *Sample.State.values], required=False, default="")

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
        samples = selectors.samples_for_review(scope=selectors.review_scope(actor=request.user),
                                               tenant_id=f["tenant"], flag=f["flag"], reward=f["reward"],
                                               state=f["state"])
        paginator = SamplePagination()
        page = paginator.paginate_queryset(samples, request, view=self)
        return paginator.get_paginated_response(SampleOutputSerializer(page, many=True).data)


class SampleDetailApi(APIView):
    @extend_schema(tags=REVIEW_TAGS, operation_id="review_samples_retrieve",
                   responses={200: SampleDetailOutputSerializer, 403: FORBIDDEN, 404: NOT_FOUND})
    def get(self, request, sample_id: int):
        sample = selectors.sample_get_for_review(scope=selectors.review_scope(actor=request.user),
                                                 sample_id=sample_id)
        return Response(SampleDetailOutputSerializer(sample).data)


class SampleApproveApi(APIView):
    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)

        class Meta:
            ref_name = "SampleApproveInput"

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer,
                   responses={200: SampleOutputSerializer, 409: CONFLICT, **REVIEW_ERRORS})
    def post(self, request, sample_id: int):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        sample = services.sample_approve(actor=request.user, sample_id=sample_id, ip=client_ip(request),
                                         **data.validated_data)
        return Response(SampleOutputSerializer(sample).data)


class SampleRejectApi(APIView):
    class InputSerializer(serializers.Serializer):
        # The service says why a reason is needed too (bulk rejections and the web console go through it).
        reason = serializers.CharField(max_length=2000, help_text="Why the sample is rejected (required).")

        class Meta:
            ref_name = "SampleRejectInput"

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer,
                   responses={200: SampleOutputSerializer, 409: CONFLICT, **REVIEW_ERRORS})
    def post(self, request, sample_id: int):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        sample = services.sample_reject(actor=request.user, sample_id=sample_id, ip=client_ip(request),
                                        **data.validated_data)
        return Response(SampleOutputSerializer(sample).data)


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
                {"required": ["reason"], "properties": {"reason": {"pattern": r"\S"}}},
            ]}

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer, responses={
        200: inline_serializer(name="ReviewBulkOutput", fields={
            "count": serializers.IntegerField(), "results": SampleOutputSerializer(many=True)}),
        409: CONFLICT, **REVIEW_ERRORS})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        samples = services.samples_bulk_decide(actor=request.user, sample_ids=v["ids"], action=v["action"],
                                               reason=v["reason"], ip=client_ip(request))
        return Response({"count": len(samples), "results": SampleOutputSerializer(samples, many=True).data})


class ReviewPolicyApi(APIView):
    class InputSerializer(serializers.Serializer):
        mode = serializers.ChoiceField(choices=ReviewPolicy.Mode.choices)

        class Meta:
            ref_name = "ReviewPolicyInput"

    class OutputSerializer(serializers.Serializer):
        tenant = serializers.IntegerField(source="tenant_id")
        mode = serializers.CharField()

        class Meta:
            ref_name = "ReviewPolicyOutput"

    def _tenant(self, request, tenant_id: int) -> Tenant:
        return selectors.tenant_get_for_review(scope=selectors.review_scope(actor=request.user),
                                               tenant_id=tenant_id)

    @extend_schema(tags=REVIEW_TAGS, responses={200: OutputSerializer, 403: FORBIDDEN, 404: NOT_FOUND})
    def get(self, request, tenant_id: int):
        return Response(self.OutputSerializer(selectors.review_policy_for(tenant=self._tenant(request,
                                                                                              tenant_id))).data)

    @extend_schema(tags=REVIEW_TAGS, request=InputSerializer,
                   responses={200: OutputSerializer, **REVIEW_ERRORS})
    def patch(self, request, tenant_id: int):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        policy = services.review_policy_set(actor=request.user, tenant=self._tenant(request, tenant_id),
                                            mode=data.validated_data["mode"], ip=client_ip(request))
        return Response(self.OutputSerializer(policy).data)


# --- /api/me/ -----------------------------------------------------------------------------------------------


class MySampleOutputSerializer(serializers.Serializer):
    """A sample as its own user sees it: where it stands, not who reviewed it."""

    id = serializers.IntegerField()
    tenant = TenantOutputSerializer()
    turn_id = serializers.IntegerField()
    reward = serializers.IntegerField()
    has_hint = serializers.BooleanField()
    state = serializers.CharField()
    reason = serializers.CharField()
    trained = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_trained(self, sample) -> bool:
        return sample.trained_at is not None


class MySampleListApi(APIView):
    @extend_schema(tags=ME_TAGS, parameters=PAGE_PARAMETERS,
                   responses=_page_of("MySamplePage", MySampleOutputSerializer(many=True)))
    def get(self, request):
        paginator = SamplePagination()
        page = paginator.paginate_queryset(selectors.samples_for_user(user=request.user), request, view=self)
        return paginator.get_paginated_response(MySampleOutputSerializer(page, many=True).data)


class MySampleDeleteApi(APIView):
    @extend_schema(tags=ME_TAGS, responses={
        204: OpenApiResponse(description="Deleted: never offered for training again."),
        404: openapi_error("No such sample of the caller's.")})
    def delete(self, request, sample_id: int):
        services.sample_delete_own(actor=request.user, sample_id=sample_id, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class PrivacyOutputSerializer(serializers.Serializer):
    training_enabled = serializers.BooleanField()
    store_turns = serializers.BooleanField()
    keys = serializers.SerializerMethodField()

    def get_keys(self, user) -> list[dict]:
        return [{"id": k.pk, "name": k.name, "display": k.display, "training_enabled": k.training_enabled}
                for k in keys_for_user(user=user)]


class PrivacyApi(APIView):
    class InputSerializer(serializers.Serializer):
        training_enabled = serializers.BooleanField(required=False)
        store_turns = serializers.BooleanField(required=False)

        class Meta:
            ref_name = "PrivacyInput"

    @extend_schema(tags=ME_TAGS, responses=PrivacyOutputSerializer)
    def get(self, request):
        return Response(PrivacyOutputSerializer(request.user).data)

    @extend_schema(tags=ME_TAGS, request=InputSerializer,
                   responses={200: PrivacyOutputSerializer, 400: INVALID})
    def patch(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.privacy_update(actor=request.user, ip=client_ip(request), **data.validated_data)
        return Response(PrivacyOutputSerializer(user).data)


class MyKeyTrainingApi(APIView):
    class InputSerializer(serializers.Serializer):
        training_enabled = serializers.BooleanField()

        class Meta:
            ref_name = "MyKeyTrainingInput"

    @extend_schema(tags=ME_TAGS, request=InputSerializer, responses={
        200: inline_serializer(name="KeyTrainingOutput", fields={
            "id": serializers.IntegerField(), "training_enabled": serializers.BooleanField()}),
        400: INVALID, 404: openapi_error("No such key of the caller's.")})
    def patch(self, request, key_id: int):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = services.key_training_set(actor=request.user, key_id=key_id, ip=client_ip(request),
                                        **data.validated_data)
        return Response({"id": key.pk, "training_enabled": key.training_enabled})


class ExportApi(APIView):
    @extend_schema(tags=ME_TAGS, responses={200: OpenApiResponse(
        description="Everything ClawHub holds about the caller as JSON: profile, keys (no secrets), "
                    "memberships, sessions, turns, judgments, samples, usage and the audit rows about "
                    "them.")})
    def get(self, request):
        response = Response(selectors.user_data_export(user=request.user))
        response["Content-Disposition"] = 'attachment; filename="clawhub-export.json"'
        return response


class AccountDeleteApi(APIView):
    class InputSerializer(serializers.Serializer):
        password = serializers.CharField(allow_blank=True, trim_whitespace=False)

        class Meta:
            ref_name = "AccountDeleteInput"

    class OutputSerializer(serializers.Serializer):
        detail = serializers.CharField()
        groups_kept = serializers.ListField(
            child=serializers.CharField(),
            help_text="Groups whose shared adapter stays (it is the other members' too); it was trained "
                      "partly on the caller's samples, which are deleted.")

        class Meta:
            ref_name = "AccountDeleteOutput"

    @extend_schema(tags=ME_TAGS, request=InputSerializer, responses={
        200: OutputSerializer,
        403: openapi_error("Wrong password (wrong_password), or not a signed-in session."),
        409: openapi_error("The caller owns groups with other members (owner_must_transfer; data.groups).")})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        report = services.account_delete(actor=request.user, password=data.validated_data["password"],
                                         ip=client_ip(request))
        # The session belonged to a user who no longer exists.
        user_logout(request=request._request)
        return Response(self.OutputSerializer({"detail": services.deletion_summary(report),
                                               "groups_kept": report.groups_kept}).data)

