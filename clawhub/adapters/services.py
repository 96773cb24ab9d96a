"""Writes for adapter versions: create, the gate's start and the hold of what it passed while pinned, activate
(promotion and rollback), unload, pin. The gate's decision and the lineage rejections (a rejected version
gives its run's samples back) and the sweeper that re-drives what a lost worker forgot are in
clawhub/training/lineage_services.py.

Hot swap across gateway processes (the design this module implements)
---------------------------------------------------------------------
Every gateway process resolves a tenant to its active version through ``active_adapter_for_tenant`` and caches
the answer, with the tenant's adapter generation (clawhub.adapters.cache) it was read under: the switch bumps
it, and each request's admission compares it, so a process reads the new version at its next request (or
after GATEWAY_ADAPTER_CACHE_SECONDS when Redis is away). A switch can still never be seen by all processes at
the same instant, and the design makes that harmless instead of trying to prevent it:

1. Pre-load. The worker loads the new version under its own unique name (``t<tenant>-v<version>``) on every
   healthy upstream (the gateway may route a tenant to any of them), straight through vLLM's
   ``/v1/load_lora_adapter``, and records the LoadedAdapter rows (through ``clawhub.adapters.registry``, the
   registry's one writer). A failed load aborts the promotion before
   anything switched; the task retries.
2. Switch. One transaction, the tenant row locked: the old active version becomes ``retired`` with
   ``drain_until = now + CLAWHUB_ADAPTER_DRAIN_SECONDS``, the new one ``active``. From here on, a gateway
   whose cache expires maps the tenant to the new name, which every upstream already holds: the first request
   pays no load and cannot fail on one. A gateway whose cache has not expired yet still sends the old name,
   which is still loaded. Both names are valid during the window, so no request fails either way.
3. Drain, time-based. The old version stays loaded until ``drain_until``; the grace period must exceed the
   gateway's adapter cache TTL plus the longest request (the default is exactly GATEWAY_ADAPTER_CACHE_SECONDS
   + GATEWAY_UPSTREAM_TIMEOUT + 5 s). No per-request counters are kept across processes: that would add a
   Redis round trip to the hot path for something a clock bound already guarantees.
4. Unload. The task ``clawhub.train.unload_drained`` (scheduled at the switch with that countdown, and swept
   every minute by celery beat in case a worker lost it) unloads every retired version whose drain is over
   from every upstream and marks it ``unloaded_at``. A version that became active again in between (a
   rollback) is no longer retired and is left alone.

Rollback is the same activation with an earlier version: it is loaded again under its own existing name (the
same weights, so the name is not reused for different ones).
"""

import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clawhub.accounts.audit import audit_record_for_tenant
from clawhub.accounts.models import User
from clawhub.adapters import serving
from clawhub.adapters.cache import adapter_cache_invalidate
from clawhub.adapters.lineage_services import adapter_unload_everywhere
from clawhub.adapters.models import AdapterPin, AdapterVersion
from clawhub.adapters.registry import loaded_adapter_record, loaded_adapters_forget
from clawhub.adapters.selectors import adapter_in_flight, adapters_to_unload
from clawhub.core import tasks
from clawhub.core.exceptions import Conflict, ValidationFailed
from clawhub.tenants.access import TenantAccess
from clawhub.tenants.models import Tenant

logger = logging.getLogger("clawhub.adapters")

def artifact_dir(*, tenant_id: int, version: int) -> Path:
    return Path(settings.CLAWHUB_ADAPTER_DIR) / f"t{tenant_id}" / f"v{version}"


# --- create -------------------------------------------------------------------------------------------------


@transaction.atomic
def adapter_version_create(
    *,
    tenant: Tenant,
    parent: AdapterVersion | None,
    metrics: dict | None = None,
    artifact_path: str | None = None,
) -> AdapterVersion:
    """A new candidate with the tenant's next version number. The artifact directory is where the trainer
    exports to; it is named after the version, so a version's weights never move."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()  # numbers are handed out one at a time
    last = AdapterVersion.objects.filter(tenant=tenant).order_by("-version").values_list("version", flat=True)
    number = (last.first() or 0) + 1
    version = AdapterVersion.objects.create(
        tenant=tenant,
        version=number,
        parent=parent,
        metrics=metrics or {},
        artifact_path=artifact_path or str(artifact_dir(tenant_id=tenant.pk, version=number)),
    )
    audit_record_for_tenant(
        actor=None,
        action="adapter.created",
        target=version,
        tenant=tenant,
        version=number,
        parent=parent.version if parent else None,
    )
    return version


# --- eval gate ----------------------------------------------------------------------------------------------


def adapter_evaluation_start(*, version: AdapterVersion) -> AdapterVersion:
    """The gate takes the candidate (again, on a redelivery): evaluating since now."""
    updated = AdapterVersion.objects.filter(
        pk=version.pk, state__in=[AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING]
    ).update(state=AdapterVersion.State.EVALUATING, evaluating_since=timezone.now())
    version.refresh_from_db()
    if not updated:
        raise Conflict(
            f"Version {version.version} is {version.state}; only candidates are evaluated.",
            code="adapter_not_candidate",
        )
    return version


def adapter_hold(*, version: AdapterVersion) -> AdapterVersion:
    """A candidate that passed the gate while its tenant is pinned waits as a candidate; an owner or admin
    may roll forward to it later."""
    AdapterVersion.objects.filter(pk=version.pk, state=AdapterVersion.State.EVALUATING).update(
        state=AdapterVersion.State.CANDIDATE, held_at=timezone.now()
    )
    version.refresh_from_db()
    audit_record_for_tenant(
        actor=None, action="adapter.held", target=version, tenant=version.tenant, reason="pinned"
    )
    return version


# --- activation (promotion and rollback) -------------------------------------------------------------------


class ParentRetired(Exception):
    """A promotion refused at the switch: the candidate's parent is no longer the tenant's active version
    (``active``, read under the tenant's lock). Nothing switched; the candidate's pre-loads are still on the
    upstreams until the caller rejects it (adapter_reject_stale_parent)."""

    def __init__(self, *, version: AdapterVersion, active: AdapterVersion | None):
        super().__init__(f"the parent of {version.upstream_name} is no longer the active version")
        self.version, self.active = version, active


def adapter_activate(
    *,
    version: AdapterVersion,
    actor: User | None = None,
    reason: str = "promote",
    upstreams: list[serving.UpstreamTarget] | None = None,
) -> AdapterVersion:
    """Makes ``version`` the tenant's active version without failing a request (see the module docstring):
    pre-load everywhere, switch in one transaction, let the old version drain, unload it later.

    A promotion (``reason="promote"``) re-checks the lineage under the tenant's lock at the switch, because
    its gate ran for minutes on a parent read without one: a rollback or a promotion by hand made meanwhile
    (the parent is no longer active) raises ParentRetired with nothing switched, for the caller to reject the
    version with its samples back in the pool (the samples are training's); a pin made meanwhile holds it, its
    pre-loads removed, and the returned version says so (candidate with ``held_at``). A rollback is an
    explicit choice and is not re-checked."""
    version.refresh_from_db()
    if version.state == AdapterVersion.State.ACTIVE:
        return version  # a redelivered promotion: done already
    targets = serving.healthy_upstreams(upstreams)
    if not targets:
        # Nothing to pre-load on; the gateway loads on first use once an upstream is back.
        logger.warning("activating %s with no healthy upstream", version.upstream_name)
    for up in targets:
        serving.load_adapter(up, name=version.upstream_name, path=version.artifact_path)
        # The gateway's writer thread mirrors the registry too; the loads made here are recorded at once.
        loaded_adapter_record(url=up.url, base_model=up.base_model, adapter_name=version.upstream_name,
                              adapter_version_id=version.pk)

    grace = timedelta(seconds=settings.CLAWHUB_ADAPTER_DRAIN_SECONDS)
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=version.tenant_id).first()
        version = AdapterVersion.objects.select_for_update().get(pk=version.pk)
        if version.state == AdapterVersion.State.ACTIVE:
            return version
        now = timezone.now()
        old = (
            AdapterVersion.objects.select_for_update()
            .filter(tenant_id=version.tenant_id, state=AdapterVersion.State.ACTIVE)
            .first()
        )
        refused = _promotion_refused(version=version, active=old) if reason != "rollback" else None
        if refused is None:
            _switch(version=version, old=old, now=now, grace=grace, actor=actor, reason=reason,
                    upstreams=[up.url for up in targets])
    if refused == "stale_parent":
        # A rollback or a promotion by hand made during the gate wins; nothing switched.
        raise ParentRetired(version=version, active=old)
    if refused == "pinned":
        version = adapter_hold(version=version)
        adapter_unload_everywhere(version)  # not served while held; rolling forward to it loads it again
    return version


def _promotion_refused(*, version: AdapterVersion, active: AdapterVersion | None) -> str | None:
    """Why a candidate must not become active now, read under the tenant's lock: its parent is no longer the
    active version ("stale_parent"), or the tenant is pinned ("pinned")."""
    if (active.pk if active else None) != version.parent_id:
        return "stale_parent"
    if AdapterPin.objects.filter(tenant_id=version.tenant_id).exists():
        return "pinned"
    return None


def _switch(*, version: AdapterVersion, old: AdapterVersion | None, now, grace: timedelta, actor: User | None,
            reason: str, upstreams: list[str]) -> None:
    """The switch itself, inside the caller's transaction with the tenant's row locked."""
    if old is not None:
        # Retire first: at most one active row per tenant, checked at each statement.
        old.state, old.retired_at, old.drain_until, old.unloaded_at = (
            AdapterVersion.State.RETIRED,
            now,
            now + grace,
            None,
        )
        old.save(update_fields=["state", "retired_at", "drain_until", "unloaded_at"])
    version.state, version.promoted_at = AdapterVersion.State.ACTIVE, now
    version.retired_at = version.drain_until = version.unloaded_at = None
    version.save(update_fields=["state", "promoted_at", "retired_at", "drain_until", "unloaded_at"])
    audit_record_for_tenant(
        actor=actor,
        action=f"adapter.{'rolled_back' if reason == 'rollback' else 'promoted'}",
        target=version,
        tenant=version.tenant,
        version=version.version,
        previous=old.version if old else None,
        upstreams=upstreams,
    )
    # Every gateway reads the tenant's adapter again on its next request (its cached copy may be minutes old).
    tenant_id = version.tenant_id
    transaction.on_commit(lambda: adapter_cache_invalidate(tenant_id=tenant_id))
    if old is not None:
        tasks.enqueue_on_commit(tasks.UNLOAD_DRAINED, countdown=grace.total_seconds() + 1)


def adapter_unload_drained(*, now=None, upstreams: list[serving.UpstreamTarget] | None = None) -> list[str]:
    """Unloads every retired version whose drain period is over from every upstream. An upstream that is down
    is retried on the next sweep (a restarted vLLM has forgotten it anyway), and so is a version a gateway
    still has a request on (one that outlasted the drain period)."""
    now = now or timezone.now()
    targets = serving.configured_upstreams() if upstreams is None else upstreams
    done = []
    for version in adapters_to_unload(now=now):
        name = version.upstream_name
        if adapter_in_flight(adapter_name=name):
            continue
        if all([serving.unload_adapter(up, name=name) for up in targets]):
            with transaction.atomic():
                # Only if it is still retired: a rollback in the meantime made it active again.
                marked = AdapterVersion.objects.filter(
                    pk=version.pk, state=AdapterVersion.State.RETIRED, unloaded_at__isnull=True
                ).update(unloaded_at=now)
                if marked:
                    loaded_adapters_forget(adapter_name=name)
                    done.append(name)
            if not marked:
                # Lost the race with a rollback: the version is active again and must be served.
                for up in serving.healthy_upstreams(targets):
                    serving.load_adapter(up, name=name, path=version.artifact_path)
    return done


def adapter_rollback(
    *, access: TenantAccess, version: AdapterVersion, ip: str | None = None
) -> AdapterVersion:
    """Asks the worker to make an earlier version active again (the swap needs the upstreams, so it runs in
    the ``clawhub.train.promote`` task). Retired versions and held candidates qualify; the active one,
    rejected ones, and candidates still on their way through the gate, do not."""
    access.require_manage("roll back the adapter")
    if version.tenant_id != access.tenant.pk:
        raise ValidationFailed("The version belongs to another tenant.", field="version")
    # Only to weights that passed the gate: a retired version (active before) or a candidate held because the
    # tenant is pinned. A rejected one would let a poisoned batch the gate stopped be served after all.
    if not (version.state == AdapterVersion.State.RETIRED
            or (version.state == AdapterVersion.State.CANDIDATE and version.held_at is not None)):
        raise Conflict(
            f"Version {version.version} is {version.state}; roll back to a retired version (one that was "
            "active before), or promote a held candidate.",
            code="adapter_not_rollbackable",
        )
    pin = AdapterPin.objects.filter(tenant=access.tenant).first()
    if pin is not None and pin.version_id != version.pk:
        raise Conflict("The adapter is pinned; unpin it first.", code="adapter_pinned")
    audit_record_for_tenant(
        actor=access.actor,
        action="adapter.rollback_requested",
        target=version,
        tenant=access.tenant,
        ip=ip,
        version=version.version,
    )
    tasks.enqueue_on_commit(tasks.PROMOTE, version.pk, rollback=True, actor_id=access.actor.pk)
    return version


# --- pin ----------------------------------------------------------------------------------------------------


@transaction.atomic
def adapter_pin(*, access: TenantAccess, reason: str = "", ip: str | None = None) -> AdapterPin:
    """Pins the tenant to its active version: new candidates are evaluated but not promoted."""
    access.require_manage("pin the adapter")
    # The tenant's lock, as at a switch: a pin is either seen by a promotion's switch (which then holds its
    # candidate) or made after it (and pins the version that switch made active).
    Tenant.objects.select_for_update().filter(pk=access.tenant.pk).first()
    active = AdapterVersion.objects.filter(tenant=access.tenant, state=AdapterVersion.State.ACTIVE).first()
    if active is None:
        raise Conflict("There is no active version to pin.", code="no_active_version")
    pin, _ = AdapterPin.objects.update_or_create(
        tenant=access.tenant,
        defaults={
            "version": active,
            "pinned_by": access.actor,
            "reason": reason[:300],
            "created_at": timezone.now(),
        },
    )
    audit_record_for_tenant(
        actor=access.actor,
        action="adapter.pinned",
        target=active,
        tenant=access.tenant,
        ip=ip,
        version=active.version,
        reason=reason,
    )
    return pin


@transaction.atomic
def adapter_unpin(*, access: TenantAccess, ip: str | None = None) -> None:
    access.require_manage("unpin the adapter")
    pin = AdapterPin.objects.select_related("version").filter(tenant=access.tenant).first()
    if pin is None:
        raise Conflict("The adapter is not pinned.", code="not_pinned")
    pin.delete()
    audit_record_for_tenant(
        actor=access.actor,
        action="adapter.unpinned",
        target=pin.version,
        tenant=access.tenant,
        ip=ip,
        version=pin.version.version,
    )
