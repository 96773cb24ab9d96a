"""Reads for tenants."""

from clawhub.tenants.models import Tenant


def tenant_for_user(*, user) -> Tenant:
    return Tenant.objects.get(kind=Tenant.Kind.USER, user=user)


def tenant_for_group(*, group) -> Tenant:
    return Tenant.objects.select_related("group").get(kind=Tenant.Kind.GROUP, group=group)


def tenant_label(tenant: Tenant) -> str:
    if tenant.kind == Tenant.Kind.GROUP:
        return f"group {tenant.group.slug}"  # type: ignore[union-attr]  # a group tenant has its group
    return f"personal: {tenant.user.email}"  # type: ignore[union-attr]  # a user tenant has its user
