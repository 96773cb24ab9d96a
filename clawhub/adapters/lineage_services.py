"""Writes around a promotion that need no training run: whether a version still continues the active one,
unloading a version that must not be served from every upstream, and a promotion that gave up for now
(adapters/services.py has the hot swap these protect). Rejecting a version out of the lineage, which gives
the samples it trained back to the pool, and the sweeper that re-drives what a lost worker forgot are
training's (clawhub/training/lineage_services.py)."""



from clawhub.accounts.audit import audit_record_for_tenant
from clawhub.adapters import serving
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.registry import loaded_adapters_forget


def adapter_parent_is_current(*, version: AdapterVersion) -> bool:
    """Whether the version still continues what the tenant is served: its parent is the active version (or,
    for a first version, nothing is active). Otherwise promoting it would drop the active version's
    feedback from the lineage."""
    active = AdapterVersion.objects.filter(
        tenant_id=version.tenant_id, state=AdapterVersion.State.ACTIVE
    ).first()
    return (active.pk if active else None) == version.parent_id


def adapter_unload_everywhere(version: AdapterVersion) -> None:
    """Unloads a version that must not be served from every upstream that has (or may have) it: pre-loads of a
    promotion that did not complete. An upstream that is down forgets it on restart; the row goes anyway."""
    for up in serving.configured_upstreams():
        serving.unload_adapter(up, name=version.upstream_name)
    loaded_adapters_forget(adapter_name=version.upstream_name)


def adapter_promotion_failed(*, version: AdapterVersion, error: str) -> AdapterVersion:
    """The promote task gave up for now (an upstream kept refusing): the pre-loads it left on the upstreams
    that did load the version are removed, and the version goes back to candidate with the error on its
    page; the sweeper sends it again after CLAWHUB_PROMOTION_STUCK_SECONDS."""
    version.refresh_from_db()
    if version.state not in (AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING):
        return version
    adapter_unload_everywhere(version)  # first: once the error shows, nothing of this attempt is left loaded
    updated = AdapterVersion.objects.filter(
        pk=version.pk, state__in=[AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING]
    ).update(state=AdapterVersion.State.CANDIDATE, promotion_error=error[:2000])
    version.refresh_from_db()
    if updated:
        audit_record_for_tenant(
            actor=None,
            action="adapter.promotion_failed",
            target=version,
            tenant=version.tenant,
            error=error[:500],
        )
    return version
