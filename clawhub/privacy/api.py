"""REST API: users' own data (/api/me/…): their samples, the training and storage switches, the export and
deleting the account."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.accounts.services import user_logout
from clawhub.core.api import PAGE_PARAMETERS, client_ip, openapi_error, page_of
from clawhub.keys.selectors import keys_for_user
from clawhub.privacy import selectors, services
from clawhub.review.api import INVALID, SamplePagination, TenantOutputSerializer

ME_TAGS = ["privacy"]
_page_of = page_of


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
                    "memberships, where they are signed in (browser sessions), conversation sessions, "
                    "turns, judgments, samples, usage and the audit rows about them.")})
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

