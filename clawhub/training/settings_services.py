"""Writes for a tenant's training settings (method, overrides, backend, batch size, auto start), and the
check every effective training config passes before it is stored or a run starts with it."""

from typing import Any

from django.conf import settings
from django.db import transaction

from clawhub.accounts.audit import audit_record_for_tenant as _audit
from clawhub.core.exceptions import PermissionDenied, ValidationFailed
from clawhub.tenants.access import TenantAccess
from clawhub.training.models import Backend, Method, TrainingSettings
from clawhub.training.schema import overrides_problems
from clawhub.training.selectors import effective_config, training_settings_for


def validate_config(config: dict[str, Any]) -> None:
    """ValidationFailed for a config TrainConfig refuses, or one over the operator's upper bounds."""
    from workers.trainer.backend import TrainConfig, bound_problems  # plain dataclasses: no torch is imported

    try:
        too_big = bound_problems(TrainConfig.from_dict(config), settings.CLAWHUB_TRAIN_UPPER_BOUNDS)
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(str(exc), field="overrides") from None
    if too_big:  # what one tenant may ask of a shared GPU (security review, finding 3)
        raise ValidationFailed("Training settings out of range: " + "; ".join(too_big) + ".",
                               field="overrides")


@transaction.atomic
def training_settings_update(
    *,
    access: TenantAccess,
    method: str | None = None,
    overrides: dict | None = None,
    backend: str | None = None,
    batch_size: int | None = None,
    auto_start: bool | None = None,
    ip: str | None = None,
) -> TrainingSettings:
    """Owners and admins (and staff) tune method, hyperparameters, batch size and auto start; only site staff
    choose the backend. ``batch_size=0`` goes back to the site default."""
    access.require_manage("change training settings")
    ts = training_settings_for(tenant=access.tenant)
    changes: dict[str, Any] = {}
    if backend is not None and backend != ts.backend:
        if not access.is_staff:
            raise PermissionDenied("Only site staff choose the training backend.", code="backend_staff_only")
        if backend and backend not in Backend.values:
            raise ValidationFailed(f"Unknown backend {backend!r}.", field="backend", allowed=Backend.values)
        ts.backend, changes["backend"] = backend, backend
    if method is not None:
        if method not in Method.values:
            raise ValidationFailed(f"Unknown method {method!r}.", field="method", allowed=Method.values)
        ts.method, changes["method"] = method, method
    if overrides is not None:
        if not isinstance(overrides, dict) or "method" in overrides:
            raise ValidationFailed(
                "overrides is an object of TrainConfig fields (the method has its own field).",
                field="overrides",
            )
        problems = overrides_problems(overrides)
        if problems:
            raise ValidationFailed("Training settings refused: " + "; ".join(problems) + ".",
                                   field="overrides")
        ts.overrides, changes["overrides"] = overrides, overrides
    if batch_size is not None:
        if batch_size < 0 or batch_size > settings.CLAWHUB_TRAIN_MAX_BATCH_SIZE:
            raise ValidationFailed(
                f"batch_size: allowed range is 1–{settings.CLAWHUB_TRAIN_MAX_BATCH_SIZE} "
                "(0 = the site default).",
                field="batch_size",
            )
        ts.batch_size, changes["batch_size"] = batch_size or None, batch_size
    if auto_start is not None:
        ts.auto_start, changes["auto_start"] = auto_start, auto_start
    validate_config(effective_config(ts))
    ts.updated_by = access.actor
    ts.save()
    _audit(
        actor=access.actor,
        action="training.settings_updated",
        target=ts,
        tenant=access.tenant,
        ip=ip,
        **changes,
    )
    return ts
