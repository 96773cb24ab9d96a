"""Reads for training: a tenant's settings and effective config, runs, and a run's claimed samples."""

from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from clawhub.accounts.models import User
from clawhub.adapters.selectors import TenantAccess, tenant_access_for_row
from clawhub.review.models import Sample
from clawhub.tenants.models import Tenant
from clawhub.training.models import Method, TrainingRun, TrainingSettings


def training_settings_for(*, tenant: Tenant) -> TrainingSettings:
    """The tenant's settings, or an unsaved row with the defaults."""
    return TrainingSettings.objects.filter(tenant=tenant).first() or TrainingSettings(
        tenant=tenant, method=Method.COMBINE
    )


def batch_size_for(ts: TrainingSettings) -> int:
    return ts.batch_size or settings.CLAWHUB_TRAINING_BATCH_SIZE


def backend_for(ts: TrainingSettings) -> str:
    return ts.backend or settings.CLAWHUB_TRAIN_BACKEND


def effective_config(ts: TrainingSettings) -> dict[str, Any]:
    """Site defaults, then the tenant's overrides, then its method: a plain dict TrainConfig accepts."""
    return {**settings.CLAWHUB_TRAIN_DEFAULTS, **(ts.overrides or {}), "method": ts.method}


def runs_for_tenant(*, tenant: Tenant) -> QuerySet[TrainingRun]:
    return (
        TrainingRun.objects.filter(tenant=tenant)
        .select_related("started_by", "adapter_version", "parent_version")
        .order_by("-created_at", "-id")
    )


def open_run_for_tenant(*, tenant: Tenant) -> TrainingRun | None:
    return TrainingRun.objects.filter(tenant=tenant, state__in=TrainingRun.OPEN_STATES).first()


def run_get(*, actor: User, run_id: int) -> tuple[TrainingRun, TenantAccess]:
    run = (
        TrainingRun.objects.select_related("started_by", "adapter_version", "parent_version")
        .filter(pk=run_id)
        .first()
    )
    return run, tenant_access_for_row(actor=actor, row=run, not_found="No such training run.")


def run_for_task(*, run_id: int) -> TrainingRun | None:
    return (
        TrainingRun.objects.select_related("tenant", "parent_version", "adapter_version")
        .filter(pk=run_id)
        .first()
    )


def samples_of_run(*, run: TrainingRun) -> list[Sample]:
    """The run's claimed samples in the order it claimed them (the trainer's batch order, which a resumed run
    must repeat). A sample its user deleted since is left out."""
    by_id = {
        s.pk: s
        for s in Sample.objects.filter(pk__in=run.sample_ids, training_run_id=run.pk)
        .exclude(state=Sample.State.DELETED)
        .select_related("turn", "judgment")
    }
    return [by_id[i] for i in run.sample_ids if i in by_id]
