"""Reads for adapter versions."""

from clawhub.adapters.models import AdapterVersion


def active_adapter_for_tenant(*, tenant_id: int) -> AdapterVersion | None:
    """The version the gateway serves for this tenant, or None (then the base model answers)."""
    return AdapterVersion.objects.filter(tenant_id=tenant_id, state=AdapterVersion.State.ACTIVE).first()
