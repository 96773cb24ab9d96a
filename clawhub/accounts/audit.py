"""The audit log's writes: who changed what, when, from where, readable later by the user or group it
concerns. Kept apart from the account services so that every app's services can record a change without
importing sign-in and account code (which itself calls those apps' services)."""

from typing import TYPE_CHECKING, Any

from django.db.models import Model

from clawhub.accounts.models import AuditLog, User

if TYPE_CHECKING:
    from clawhub.tenants.models import Tenant


def audit_record(
    *,
    actor: User | None,
    action: str,
    target: Model | None,
    subject_user: User | None = None,
    group=None,
    ip: str | None = None,
    **data: Any,
) -> AuditLog:
    """Records one change that matters. ``subject_user`` and ``group`` decide who may read it later.

    ``target`` may be None for events that concern no row (a lockout of an IP address).
    """
    return AuditLog.objects.create(
        actor=actor,
        action=action,
        target_type=target._meta.model_name if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:255] if target is not None else "",
        subject_user=subject_user,
        group=group,
        ip=ip,
        data=data,
    )


def audit_record_for_tenant(
    *,
    actor: User | None,
    action: str,
    target: Model | None,
    tenant: "Tenant",
    ip: str | None = None,
    **data: Any,
) -> AuditLog:
    """``audit_record`` for a change to a tenant's training or adapters: the row is readable by the tenant's
    user or group, and ``data`` names the tenant, since the target alone (a run, a version) may not."""
    from clawhub.tenants.models import Tenant

    return audit_record(
        actor=actor,
        action=action,
        target=target,
        ip=ip,
        subject_user=tenant.user if tenant.kind == Tenant.Kind.USER else None,
        group=tenant.group if tenant.kind == Tenant.Kind.GROUP else None,
        tenant=tenant.pk,
        **data,
    )
