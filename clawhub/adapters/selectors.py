"""Reads for adapter versions, and who may see or steer a tenant's adapter and training.

Access to a tenant (resolved once per request by ``tenant_access``):
- site staff see and manage every tenant;
- a personal tenant belongs to its user, who manages it;
- a group tenant: the owner and admins manage it; members and viewers see it (runs, versions) but change
  nothing (403); anyone else gets 404, so that group names and ids do not leak.
"""

from dataclasses import dataclass

from django.db.models import Model, Q, QuerySet

from clawhub.accounts.models import User
from clawhub.adapters.models import AdapterPin, AdapterVersion
from clawhub.core.exceptions import NotFound, PermissionDenied
from clawhub.groups.models import ROLE_RANK, Membership, Role
from clawhub.tenants.models import Tenant


def active_adapter_for_tenant(*, tenant_id: int) -> AdapterVersion | None:
    """The version the gateway serves for this tenant, or None (then the base model answers)."""
    return AdapterVersion.objects.filter(tenant_id=tenant_id, state=AdapterVersion.State.ACTIVE).first()


# --- access -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantAccess:
    tenant: Tenant
    actor: User
    role: str  # "staff", "self" (personal tenant), or the group role
    can_manage: bool

    @property
    def is_staff(self) -> bool:
        return self.actor.is_staff

    def require_manage(self, what: str = "do this") -> None:
        if not self.can_manage:
            raise PermissionDenied(f"Only the group's owner and admins, and site staff, may {what}.")


def tenant_access(*, actor: User, tenant_id: int) -> TenantAccess:
    tenant = Tenant.objects.select_related("group", "user").filter(pk=tenant_id).first()
    if tenant is None or not actor.is_authenticated:
        raise NotFound("No such tenant.")
    if actor.is_staff:
        return TenantAccess(tenant=tenant, actor=actor, role="staff", can_manage=True)
    if tenant.kind == Tenant.Kind.USER:
        if tenant.user_id != actor.pk:
            raise NotFound("No such tenant.")
        return TenantAccess(tenant=tenant, actor=actor, role="self", can_manage=True)
    membership = Membership.objects.filter(group_id=tenant.group_id, user=actor).first()
    if membership is None:
        raise NotFound("No such tenant.")
    role = Role(membership.role)
    return TenantAccess(
        tenant=tenant, actor=actor, role=role.value, can_manage=ROLE_RANK[role] >= ROLE_RANK[Role.ADMIN]
    )


def tenant_access_for_row(*, actor: User, row: Model | None, not_found: str) -> TenantAccess:
    """The actor's access to the tenant a row (a version, a run) belongs to. A row of a tenant the actor may
    not see is reported like a missing one, with the same message, so an id reveals nothing."""
    if row is None:
        raise NotFound(not_found)
    try:
        return tenant_access(actor=actor, tenant_id=row.tenant_id)
    except NotFound:
        raise NotFound(not_found) from None


def tenants_for_user(*, user: User) -> list[Tenant]:
    """The tenants whose adapter the user can see: their own, and their groups' (staff: only these too; the
    other tenants are reached by id)."""
    return list(
        Tenant.objects.select_related("group", "user")
        .filter(Q(user=user) | Q(group__memberships__user=user))
        .distinct()
        .order_by("kind", "id")
    )


def tenant_label(tenant: Tenant) -> str:
    if tenant.kind == Tenant.Kind.GROUP:
        return f"group {tenant.group.slug}"
    return f"personal: {tenant.user.email}"


# --- versions -----------------------------------------------------------------------------------------------


def adapter_versions(*, tenant: Tenant) -> QuerySet[AdapterVersion]:
    return AdapterVersion.objects.filter(tenant=tenant).select_related("parent").order_by("-version")


def adapter_version_get(*, actor: User, version_id: int) -> tuple[AdapterVersion, TenantAccess]:
    version = AdapterVersion.objects.filter(pk=version_id).select_related("parent").first()
    return version, tenant_access_for_row(actor=actor, row=version, not_found="No such adapter version.")


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


def heldout_samples(*, tenant: Tenant, limit: int) -> list:
    """The eval gate's held-out set: the tenant's judged turns that runs held back from their batches (never
    trained on), still approved and not deleted by their users, newest first."""
    from clawhub.review.models import Sample
    from clawhub.training.models import TrainingRun

    # Only the slice of runs that succeeded, and only samples still claimed by that run: a failed run's
    # held-out samples went back to the pool and may have been trained since.
    held = Q(pk__in=[])
    for run_id, heldout in TrainingRun.objects.filter(
        tenant=tenant, state=TrainingRun.State.SUCCEEDED
    ).values_list("pk", "heldout_ids"):
        if heldout:
            held |= Q(training_run_id=run_id, pk__in=heldout)
    return list(
        Sample.objects.filter(held, tenant=tenant, state=Sample.State.APPROVED)
        .select_related("turn", "judgment")
        .order_by("-created_at", "-id")[: max(limit, 0)]
    )
