"""REST API: a tenant's adapter versions, rollback and pinning (/api/adapters/…).

Members and viewers of a group read its versions; the owner, admins and site staff (and a user for their own
personal tenant) roll back and pin. Rollback is asynchronous: the swap runs in the ``clawhub.train.promote``
task (it talks to the upstreams), so the answer is 202 and the version turns active when the swap is done.
"""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response

from clawhub.adapters import selectors, services
from clawhub.core.api import client_ip
from clawhub.tenants.access import TenantAccess, TenantApi, TenantRowApi

TAGS = ["adapters"]


class VersionOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    tenant_id = serializers.IntegerField()
    version = serializers.IntegerField()
    name = serializers.CharField(source="upstream_name")
    state = serializers.CharField(source="display_state")
    parent = serializers.SerializerMethodField()
    eval_score = serializers.FloatField(allow_null=True)
    baseline_score = serializers.FloatField(allow_null=True)
    # The promotion gate: "promote", "not_enough_evidence", "reject", "stale_parent", "promotion_failed".
    decision = serializers.CharField(allow_blank=True)
    decision_reason = serializers.CharField(allow_blank=True)
    training_run = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    promoted_at = serializers.DateTimeField(allow_null=True)
    retired_at = serializers.DateTimeField(allow_null=True)
    unloaded_at = serializers.DateTimeField(allow_null=True)

    def get_parent(self, version) -> int | None:
        return version.parent.version if version.parent_id else None

    def get_training_run(self, version) -> int | None:
        run = getattr(version, "training_run", None)
        return run.pk if run else None


# Figures of the train worker that say how the base model was shared (how many runs, of every tenant, used
# this load of it; how many tenants trained in the same pass; how long the base took): they tell a tenant
# about the others, and nothing about their own adapter.
STAFF_ONLY_METRICS = ("trainer",)


class VersionDetailOutputSerializer(VersionOutputSerializer):
    metrics = serializers.SerializerMethodField(
        help_text="Training and evaluation figures; the train worker's (trainer) for site staff only.")
    artifact_path = serializers.SerializerMethodField(
        help_text="Where the weights are on the servers: site staff only (null for everyone else).")

    def get_metrics(self, version) -> dict:
        viewer = self.context.get("viewer")
        metrics = version.metrics or {}
        if viewer is not None and viewer.is_staff:
            return metrics
        return {name: value for name, value in metrics.items() if name not in STAFF_ONLY_METRICS}

    def get_artifact_path(self, version) -> str | None:
        # A server path tells a viewer about the operator's layout, and nothing they need.
        viewer = self.context.get("viewer")
        return version.artifact_path if viewer is not None and viewer.is_staff else None


class PinOutputSerializer(serializers.Serializer):
    pinned = serializers.BooleanField()
    version = serializers.IntegerField(allow_null=True)
    pinned_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)


def _pin_data(pin) -> dict:
    if pin is None:
        return {"pinned": False, "version": None, "pinned_by": None, "reason": ""}
    return {
        "pinned": True,
        "version": pin.version.version,
        "pinned_by": pin.pinned_by.email if pin.pinned_by else None,
        "reason": pin.reason,
    }


class VersionRowApi(TenantRowApi):
    # A view about one version: handlers take ``version`` and ``access`` (to its tenant). No docstring: it
    # would describe every operation of its subclasses in the OpenAPI schema.

    row_kwarg, row_name, not_found = "version_id", "version", "No such adapter version."

    def get_row(self, pk: int):
        return selectors.adapter_version_get(version_id=pk)


class VersionListApi(TenantApi):
    @extend_schema(
        tags=TAGS, operation_id="adapter_versions_list", responses={200: inline_serializer(
            name="AdapterVersionList", fields={"results": VersionOutputSerializer(many=True),
                                               "pin": PinOutputSerializer()})}
    )
    def get(self, request, access: TenantAccess):
        versions = selectors.adapter_versions(tenant=access.tenant).select_related("training_run")
        return Response(
            {
                "results": VersionOutputSerializer(versions, many=True).data,
                "pin": _pin_data(selectors.adapter_pin_for(tenant=access.tenant)),
            }
        )


class VersionDetailApi(VersionRowApi):
    @extend_schema(
        tags=TAGS, operation_id="adapter_version_detail", responses={200: VersionDetailOutputSerializer}
    )
    def get(self, request, version, access: TenantAccess):
        return Response(VersionDetailOutputSerializer(version, context={"viewer": request.user}).data)


class VersionRollbackApi(VersionRowApi):
    @extend_schema(
        tags=TAGS,
        operation_id="adapter_version_rollback",
        request=None,
        responses={202: VersionOutputSerializer},
    )
    def post(self, request, version, access: TenantAccess):
        version = services.adapter_rollback(access=access, version=version, ip=client_ip(request))
        return Response(VersionOutputSerializer(version).data, status=status.HTTP_202_ACCEPTED)


class PinApi(TenantApi):
    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(required=False, allow_blank=True, max_length=300, default="")

        class Meta:
            ref_name = "AdapterPinInput"

    @extend_schema(
        tags=TAGS, operation_id="adapter_pin", request=InputSerializer, responses={200: PinOutputSerializer}
    )
    def post(self, request, access: TenantAccess):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pin = services.adapter_pin(access=access, reason=data.validated_data["reason"], ip=client_ip(request))
        return Response(_pin_data(pin))


class UnpinApi(TenantApi):
    @extend_schema(
        tags=TAGS, operation_id="adapter_unpin", request=None, responses={200: PinOutputSerializer}
    )
    def post(self, request, access: TenantAccess):
        services.adapter_unpin(access=access, ip=client_ip(request))
        return Response(_pin_data(None))
