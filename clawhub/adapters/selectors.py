"""Reads for adapter versions and pins, and the tenants whose adapter a user sees. Who may see or steer a
tenant is clawhub.tenants.access."""

from django.db.models import Q, QuerySet

from clawhub.accounts.models import User
from clawhub.adapters.models import AdapterPin, AdapterVersion
from clawhub.tenants.models import Tenant


def active_adapter_for_tenant(*, tenant_id: int) -> AdapterVersion | None:
    """The version the gateway serves for this tenant, or None (then the base model answers)."""
    return AdapterVersion.objects.filter(tenant_id=tenant_id, state=AdapterVersion.State.ACTIVE).first()


# --- tenants ------------------------------------------------------------------------------------------------


def tenants_for_user(*, user: User) -> list[Tenant]:
    """The tenants whose adapter the user can see: their own, and their groups' (staff: only these too; the
    other tenants are reached by id)."""
    return list(
        Tenant.objects.select_related("group", "user")
        .filter(Q(user=user) | Q(group__memberships__user=user))
        .distinct()
        .order_by("kind", "id")
    )


# --- versions -----------------------------------------------------------------------------------------------


def adapter_versions(*, tenant: Tenant) -> QuerySet[AdapterVersion]:
    return AdapterVersion.objects.filter(tenant=tenant).select_related("parent").order_by("-version")


def adapter_version_for_tenant(*, tenant_id: int, version: int) -> AdapterVersion | None:
    """Version ``version`` of the tenant's adapter if it has weights to serve (the playground's comparisons:
    any state, a rejected one included, for the people of that tenant alone)."""
    return (AdapterVersion.objects.filter(tenant_id=tenant_id, version=version).exclude(artifact_path="")
            .first())


def adapter_version_get(*, version_id: int) -> AdapterVersion | None:
    """A version by id for a view; the view checks access to its tenant (tenants.access)."""
    return AdapterVersion.objects.filter(pk=version_id).select_related("parent").first()


def adapter_version_by_id(*, version_id: int) -> AdapterVersion | None:
    """For tasks: the row, whatever its state (the task decides what to do with it)."""
    return AdapterVersion.objects.select_related("tenant", "parent").filter(pk=version_id).first()


def adapter_pin_for(*, tenant: Tenant) -> AdapterPin | None:
    return AdapterPin.objects.select_related("version", "pinned_by").filter(tenant=tenant).first()


def adapter_is_pinned(*, tenant_id: int) -> bool:
    return AdapterPin.objects.filter(tenant_id=tenant_id).exists()


def adapters_to_unload(*, now) -> QuerySet[AdapterVersion]:
    """Retired versions whose drain period is over and that are still loaded somewhere."""
    return AdapterVersion.objects.filter(
        state=AdapterVersion.State.RETIRED,
        unloaded_at__isnull=True,
        drain_until__isnull=False,
        drain_until__lte=now,
    )


def version_lineage(*, version: AdapterVersion | None) -> list[int]:
    """The ids of `version` and its ancestors, newest first ([] for the base model). Parents are older
    versions of the same tenant, so the walk ends; the bound only guards against a corrupted cycle."""
    ids: list[int] = []
    while version is not None and version.pk not in ids and len(ids) < 100_000:
        ids.append(version.pk)
        version = version.parent
    return ids


def version_lag(*, served_id: int | None, lineage: list[int]) -> int | None:
    """How many versions the one that served a turn (None = the base model) is behind the version whose
    lineage (version_lineage) is given: 0 = that version itself; None when the serving version is not in
    that lineage (e.g. a version the tenant rolled back from)."""
    if served_id is None:
        return len(lineage)
    return lineage.index(served_id) if served_id in lineage else None


def adapter_in_flight(*, adapter_name: str) -> int | None:
    """How many requests on any gateway process hold a lease on this adapter now (clawhub.gateway.quotas);
    None when Redis is not configured or does not answer (then nobody can tell)."""
    import time

    from django.conf import settings

    if not settings.REDIS_URL:
        return None
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=settings.GATEWAY_REDIS_TIMEOUT,
                                  socket_connect_timeout=settings.GATEWAY_REDIS_TIMEOUT)
    try:
        return int(client.zcount(f"gw:busy:{adapter_name}", time.time(), "+inf"))
    except redis.RedisError:
        return None
    finally:
        client.close()
