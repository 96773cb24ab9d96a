"""REST API for API keys. The clear secret is in exactly two responses: the create and the rotate."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.core.api import client_ip, openapi_error
from clawhub.keys.models import ApiKey
from clawhub.keys.openclaw import openclaw_onboard_command, openclaw_provider_config
from clawhub.keys.scopes import ALL_SCOPES, SCOPE_DESCRIPTIONS
from clawhub.keys.selectors import (
    group_for_key_binding,
    key_get_for_owner,
    key_get_in_group,
    keys_for_group,
    keys_for_user,
)
from clawhub.keys.services import key_create, key_revoke, key_rotate, key_update
from clawhub.tenants.access import GroupApi, TenantAccess

# Responses that carry a secret must not be kept by any cache between the server and the client.
NO_STORE = {"Cache-Control": "no-store"}
LIMIT_MAX = 2**31 - 1
SCOPES_HELP = "What the key may do. " + " ".join(f"{scope}: {text}"
                                                 for scope, text in SCOPE_DESCRIPTIONS.items())


def via_key(request):
    """The API key that made the request (its ResolvedKey), or None for a signed-in session."""
    return request.auth if hasattr(request.auth, "scopes") else None


def via_scopes(request) -> list[str] | None:
    """The scopes of the request's API key, or None for a session (which may grant any scope)."""
    resolved = via_key(request)
    return resolved.scopes if resolved is not None else None


class KeyOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    display = serializers.CharField()
    group = serializers.CharField(source="group.slug", allow_null=True, default=None,
                                  help_text="The slug of the group the key is bound to, or null.")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    allowed_models = serializers.ListField(child=serializers.CharField())
    rpm_limit = serializers.IntegerField(allow_null=True)
    tpm_limit = serializers.IntegerField(allow_null=True)
    concurrency_limit = serializers.IntegerField(allow_null=True)
    scopes = serializers.ListField(child=serializers.CharField(), help_text=SCOPES_HELP)
    is_active = serializers.BooleanField()


class OpenClawOutputSerializer(serializers.Serializer):
    config = serializers.DictField(help_text="models.providers block and default model for openclaw.json.")
    onboard_command = serializers.CharField()


class KeyWithSecretOutputSerializer(serializers.Serializer):
    key = KeyOutputSerializer()
    secret = serializers.CharField(help_text="Shown in this response only; ClawHub keeps just a digest.")
    openclaw = OpenClawOutputSerializer()


def _openclaw(key: ApiKey, secret: str | None) -> dict:
    return {
        "config": openclaw_provider_config(key=key, secret=secret),
        "onboard_command": openclaw_onboard_command(key=key, secret=secret),
    }


def _with_secret(key: ApiKey, secret: str) -> dict:
    return {"key": KeyOutputSerializer(key).data, "secret": secret, "openclaw": _openclaw(key, secret)}


class _LimitsInput(serializers.Serializer):
    allowed_models = serializers.ListField(child=serializers.CharField(max_length=100), required=False,
                                           allow_empty=True, allow_null=True)
    # Stored as PostgreSQL integers.
    rpm_limit = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=LIMIT_MAX)
    tpm_limit = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=LIMIT_MAX)
    concurrency_limit = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                                 max_value=LIMIT_MAX)
    # It must be in the future; the schema's pattern admits the years from 2100 on, and offsets DRF reads.
    expires_at = serializers.DateTimeField(required=False, allow_null=True, style={"openapi": {
        "pattern": r"^(2[1-9]|[3-8][0-9])[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}"
                   r"(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:[0-9]{2})$"}},
        help_text="In the future; null = never.")
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=ALL_SCOPES), required=False,
                                   allow_empty=True, help_text=SCOPES_HELP + " Default: inference only.")


class KeyListCreateApi(APIView):
    """GET lists the caller's keys; POST creates one (the two share the collection URL). A limit left out of
    a new key is the site's default for new keys; null is no limit."""

    class InputSerializer(_LimitsInput):
        name = serializers.CharField(max_length=100)
        group = serializers.SlugField(required=False, allow_null=True, allow_blank=True)

        class Meta:
            ref_name = "KeyCreateInput"

    OutputSerializer = KeyOutputSerializer

    @extend_schema(responses=KeyOutputSerializer(many=True))
    def get(self, request):
        keys = keys_for_user(user=request.user)
        return Response(self.OutputSerializer(keys, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: KeyWithSecretOutputSerializer, 404: openapi_error(
        "No such group of the caller's (field group), or a model the key's tenant does not serve "
        "(model_not_found, data.allowed).")})
    def post(self, request):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        slug = data.pop("group", None)
        group = group_for_key_binding(slug=slug, user=request.user) if slug else None
        key, secret = key_create(owner=request.user, group=group, via_scopes=via_scopes(request),
                                 ip=client_ip(request), **data)
        return Response(_with_secret(key, secret), status=status.HTTP_201_CREATED, headers=NO_STORE)


class KeyDetailApi(APIView):
    """GET shows one of the caller's keys; PATCH changes its name, models, limits or expiry."""

    class InputSerializer(_LimitsInput):
        name = serializers.CharField(max_length=100, required=False)

        class Meta:
            ref_name = "KeyUpdateInput"

    OutputSerializer = KeyOutputSerializer

    @extend_schema(responses=KeyOutputSerializer)
    def get(self, request, key_id: int):
        key = key_get_for_owner(key_id=key_id, user=request.user)
        return Response(self.OutputSerializer(key).data)

    @extend_schema(request=InputSerializer, responses=KeyOutputSerializer)
    def patch(self, request, key_id: int):
        key = key_get_for_owner(key_id=key_id, user=request.user)
        serializer = self.InputSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        key = key_update(key=key, actor=request.user, via_scopes=via_scopes(request), ip=client_ip(request),
                         **serializer.validated_data)
        return Response(self.OutputSerializer(key).data)


class KeyRevokeApi(APIView):
    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

        class Meta:
            ref_name = "KeyRevokeInput"

    OutputSerializer = KeyOutputSerializer

    @extend_schema(request=InputSerializer, responses=KeyOutputSerializer)
    def post(self, request, key_id: int):
        key = key_get_for_owner(key_id=key_id, user=request.user)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key = key_revoke(key=key, actor=request.user, ip=client_ip(request), **serializer.validated_data)
        return Response(self.OutputSerializer(key).data)


class KeyRotateApi(APIView):
    """Returns the new secret once, with the OpenClaw block that holds it."""

    @extend_schema(request=None, responses=KeyWithSecretOutputSerializer)
    def post(self, request, key_id: int):
        key = key_get_for_owner(key_id=key_id, user=request.user)
        resolved = via_key(request)
        secret = key_rotate(key=key, actor=request.user, via_key=resolved.key if resolved else None,
                            via_scopes=via_scopes(request), ip=client_ip(request))
        return Response(_with_secret(key, secret), headers=NO_STORE)


class KeyOpenClawApi(APIView):
    """The OpenClaw block for a key, with a placeholder where the secret goes."""

    @extend_schema(responses=OpenClawOutputSerializer)
    def get(self, request, key_id: int):
        key = key_get_for_owner(key_id=key_id, user=request.user)
        return Response(_openclaw(key, None))


class GroupKeyListApi(GroupApi):
    """Every key bound to a group, for its owners and admins."""

    class OutputSerializer(KeyOutputSerializer):
        owner = serializers.EmailField(source="owner.email")

        class Meta:
            ref_name = "GroupKeyOutput"

    @extend_schema(responses=OutputSerializer(many=True))
    def get(self, request, access: TenantAccess):
        keys = keys_for_group(group=access.group, actor=request.user)
        return Response(self.OutputSerializer(keys, many=True).data)


class GroupKeyRevokeApi(GroupApi):
    InputSerializer = KeyRevokeApi.InputSerializer
    OutputSerializer = GroupKeyListApi.OutputSerializer

    @extend_schema(request=InputSerializer, responses=OutputSerializer)
    def post(self, request, access: TenantAccess, key_id: int):
        key = key_get_in_group(group=access.group, key_id=key_id, actor=request.user)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key = key_revoke(key=key, actor=request.user, ip=client_ip(request), **serializer.validated_data)
        return Response(self.OutputSerializer(key).data)
