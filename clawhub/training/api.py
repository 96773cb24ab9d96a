"""REST API: a tenant's training runs and settings (/api/training/…).

Who may do what is decided by ``clawhub.tenants.access``: members and viewers of a group
read its runs; its owner and admins (and site staff, and a user for their own personal tenant) start and
cancel runs and change settings; the backend is chosen by site staff only.
"""

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from clawhub.core.api import PAGE_PARAMETERS, Pagination, client_ip, page_of
from clawhub.tenants.access import TenantAccess, TenantApi, TenantRowApi
from clawhub.training import selectors, services, settings_services
from clawhub.training.models import Backend, Method
from clawhub.training.schema import overrides_schema

TAGS = ["training"]


class RunPagination(Pagination):
    page_size = 50
    max_page_size = 200


class RunOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    tenant_id = serializers.IntegerField()
    state = serializers.CharField()
    backend = serializers.CharField()
    method = serializers.CharField()
    started_by = serializers.SerializerMethodField()
    samples = serializers.SerializerMethodField()
    step = serializers.IntegerField()
    loss = serializers.FloatField(allow_null=True)
    mean_reward = serializers.FloatField(allow_null=True)
    mean_advantage = serializers.FloatField(allow_null=True)
    tokens = serializers.IntegerField()
    seconds = serializers.FloatField()
    adapter_version = serializers.SerializerMethodField()
    parent_version = serializers.SerializerMethodField()
    attempts = serializers.IntegerField()
    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)

    def get_started_by(self, run) -> dict | None:
        return {"id": run.started_by_id, "email": run.started_by.email} if run.started_by else None

    def get_samples(self, run) -> int:
        return len(run.sample_ids)

    def get_adapter_version(self, run) -> dict | None:
        v = run.adapter_version
        return {"id": v.pk, "version": v.version, "state": v.display_state} if v else None

    def get_parent_version(self, run) -> dict | None:
        v = run.parent_version
        return {"id": v.pk, "version": v.version} if v else None


class RunDetailOutputSerializer(RunOutputSerializer):
    config = serializers.JSONField()
    base_model = serializers.CharField()
    metrics = serializers.JSONField()
    dropped = serializers.JSONField()
    remote_ids = serializers.JSONField()
    sample_ids = serializers.JSONField()
    resumed_from_step = serializers.IntegerField(allow_null=True)
    task_id = serializers.CharField()


class RunRowApi(TenantRowApi):
    # A view about one run: handlers take ``run`` and ``access`` (to its tenant). No docstring: it would
    # describe every operation of its subclasses in the OpenAPI schema.

    row_kwarg, row_name, not_found = "run_id", "run", "No such training run."

    def get_row(self, pk: int):
        return selectors.run_get(run_id=pk)


class RunListApi(TenantApi):
    @extend_schema(
        tags=TAGS, operation_id="training_runs_list", parameters=PAGE_PARAMETERS,
        responses={200: page_of("TrainingRunPage", RunOutputSerializer(many=True))}
    )
    def get(self, request, access: TenantAccess):
        paginator = RunPagination()
        page = paginator.paginate_queryset(
            selectors.runs_for_tenant(tenant=access.tenant), request, view=self
        )
        return paginator.get_paginated_response(RunOutputSerializer(page, many=True).data)


class RunStartApi(TenantApi):
    @extend_schema(
        tags=TAGS, operation_id="training_run_start", request=None, responses={201: RunDetailOutputSerializer}
    )
    def post(self, request, access: TenantAccess):
        run = services.run_start(tenant=access.tenant, access=access, ip=client_ip(request))
        return Response(RunDetailOutputSerializer(run).data, status=status.HTTP_201_CREATED)


class RunDetailApi(RunRowApi):
    @extend_schema(tags=TAGS, operation_id="training_run_detail", responses={200: RunDetailOutputSerializer})
    def get(self, request, run, access: TenantAccess):
        return Response(RunDetailOutputSerializer(run).data)


class RunCancelApi(RunRowApi):
    @extend_schema(
        tags=TAGS,
        operation_id="training_run_cancel",
        request=None,
        responses={200: RunDetailOutputSerializer},
    )
    def post(self, request, run, access: TenantAccess):
        run = services.run_cancel(access=access, run=run, ip=client_ip(request))
        return Response(RunDetailOutputSerializer(run).data)


class SettingsOutputSerializer(serializers.Serializer):
    tenant_id = serializers.IntegerField()
    method = serializers.CharField()
    overrides = serializers.JSONField()
    backend = serializers.SerializerMethodField()
    batch_size = serializers.SerializerMethodField()
    auto_start = serializers.BooleanField()
    effective_config = serializers.SerializerMethodField()
    trainable = serializers.SerializerMethodField()

    def get_backend(self, ts) -> str:
        return selectors.backend_for(ts)

    def get_batch_size(self, ts) -> int:
        return selectors.batch_size_for(ts)

    def get_effective_config(self, ts) -> dict:
        return selectors.effective_config(ts)

    def get_trainable(self, ts) -> int:
        from clawhub.review.selectors import trainable_count

        return trainable_count(tenant=ts.tenant)


class SettingsApi(TenantApi):
    class InputSerializer(serializers.Serializer):
        method = serializers.ChoiceField(choices=Method.choices, required=False)
        overrides = serializers.JSONField(required=False, style={"openapi": overrides_schema()})
        backend = serializers.ChoiceField(choices=[("", "site default"), *Backend.choices], required=False,
                                          help_text="Site staff only (403 backend_staff_only otherwise).")
        batch_size = serializers.IntegerField(
            required=False, min_value=0, max_value=settings.CLAWHUB_TRAIN_MAX_BATCH_SIZE,
            help_text="0 = the site default.",
            error_messages={
                bound: f"allowed range is 1–{settings.CLAWHUB_TRAIN_MAX_BATCH_SIZE} (0 = the site default)."
                for bound in ("min_value", "max_value")
            },
        )
        auto_start = serializers.BooleanField(required=False)

        class Meta:
            ref_name = "TrainingSettingsInput"

    @extend_schema(tags=TAGS, operation_id="training_settings_get", responses={200: SettingsOutputSerializer})
    def get(self, request, access: TenantAccess):
        return Response(SettingsOutputSerializer(selectors.training_settings_for(tenant=access.tenant)).data)

    @extend_schema(
        tags=TAGS,
        operation_id="training_settings_update",
        request=InputSerializer,
        responses={200: SettingsOutputSerializer},
    )
    def patch(self, request, access: TenantAccess):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        ts = settings_services.training_settings_update(
            access=access, ip=client_ip(request), **data.validated_data
        )
        return Response(SettingsOutputSerializer(ts).data)
