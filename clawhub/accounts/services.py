"""Writes for users and the audit log."""

from typing import Any

from django.db import transaction
from django.db.models import Model

from clawhub.accounts.models import AuditLog, User
from clawhub.core.exceptions import Conflict, ValidationFailed


def audit_record(
    *,
    actor: User | None,
    action: str,
    target: Model,
    subject_user: User | None = None,
    group=None,
    ip: str | None = None,
    **data: Any,
) -> AuditLog:
    """Records one change that matters. ``subject_user`` and ``group`` decide who may read it later."""
    return AuditLog.objects.create(
        actor=actor,
        action=action,
        target_type=target._meta.model_name,
        target_id=str(target.pk),
        target_repr=str(target)[:255],
        subject_user=subject_user,
        group=group,
        ip=ip,
        data=data,
    )


@transaction.atomic
def user_create(*, email: str, password: str | None, display_name: str = "", **fields: Any) -> User:
    """Creates a user and their personal tenant."""
    from clawhub.tenants.models import Tenant

    email = User.objects.normalize_email(email or "").strip().lower()
    if not email or "@" not in email:
        raise ValidationFailed("A valid email address is required.", field="email")
    if User.objects.filter(email__iexact=email).exists():
        raise Conflict("An account with this email already exists.", code="email_taken", field="email")
    user = User(email=email, display_name=display_name, **fields)
    user.set_password(password) if password else user.set_unusable_password()
    user.save()
    Tenant.objects.create(kind=Tenant.Kind.USER, user=user)
    return user
