"""Who may see and steer a tenant, resolved once per request: a ``TenantAccess`` (tenant, actor, role).

- site staff see and manage every tenant (role ``staff``);
- a personal tenant belongs to its user, who manages it (role ``self``);
- a group tenant: the owner and admins manage it; members and viewers see it (runs, versions, usage) but
  change nothing (403); anyone else gets 404, so that group names and ids do not leak.

Review is stricter (``review_access``): only those who manage a tenant review its samples; members and viewers
of its group get 403, anyone else 404. ``managed_tenants`` is the same rule for lists (the review queue, the
turns one may rate): every tenant for staff, one's personal tenant, the groups one owns or administers. The
groups API answers 404 to every non-member, staff included (``group_access``); the usage API lets staff see
any group (``group_access(staff=True)``).

API views about one tenant build on ``TenantApi`` (``TenantRowApi`` for a row of a tenant: a version, a run;
``GroupApi`` for a group by slug): the view resolves the access from the URL before the handler runs and calls
the handler with ``access`` in place of the URL's id, as Sentry's organization endpoints do in
``convert_args``. Pages do the same with the ``tenant_page`` and ``tenant_row_page`` decorators. Selectors and
services take ``access.tenant`` (or the access itself where the actor's role matters).
"""

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Model, Q, QuerySet
from rest_framework.request import Request
from rest_framework.views import APIView

from clawhub.accounts.models import User
from clawhub.core.exceptions import NotFound, PermissionDenied
from clawhub.groups.models import ROLE_RANK, Group, Membership, Role
from clawhub.tenants.models import Tenant

STAFF = "staff"
SELF = "self"
REVIEW_FORBIDDEN = "Only the group's owner and admins, and site staff, review its samples."
_MANAGER_ROLES = [role.value for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[Role.ADMIN]]


@dataclass(frozen=True)
class TenantAccess:
    tenant: Tenant
    actor: User
    role: str  # STAFF, SELF (the user's personal tenant), or the actor's role in the tenant's group

    @property
    def group_role(self) -> Role | None:
        """The actor's role in the tenant's group; None for staff and for a personal tenant."""
        return Role(self.role) if self.role in Role.values else None

    @property
    def can_manage(self) -> bool:
        if self.role in (STAFF, SELF):
            return True
        return ROLE_RANK[Role(self.role)] >= ROLE_RANK[Role.ADMIN]

    @property
    def is_staff(self) -> bool:
        return self.actor.is_staff

    @property
    def group(self) -> Group | None:
        return self.tenant.group if self.tenant.kind == Tenant.Kind.GROUP else None

    def require_manage(self, what: str = "do this", *, message: str | None = None) -> None:
        if not self.can_manage:
            raise PermissionDenied(
                message or f"Only the group's owner and admins, and site staff, may {what}.")


# --- resolving ----------------------------------------------------------------------------------------------


def _access_to(*, actor: User, tenant: Tenant) -> TenantAccess | None:
    """The actor's access to a tenant, or None where it must look as if the tenant did not exist."""
    if not actor.is_authenticated:
        return None
    if actor.is_staff:
        return TenantAccess(tenant=tenant, actor=actor, role=STAFF)
    if tenant.kind == Tenant.Kind.USER:
        return TenantAccess(tenant=tenant, actor=actor, role=SELF) if tenant.user_id == actor.pk else None
    membership = Membership.objects.filter(group_id=tenant.group_id, user=actor).first()
    return TenantAccess(tenant=tenant, actor=actor, role=membership.role) if membership else None


def _tenant(tenant_id: int) -> Tenant | None:
    return Tenant.objects.select_related("group", "user").filter(pk=tenant_id).first()


def tenant_access(*, actor: User, tenant_id: int) -> TenantAccess:
    access = _access_to(actor=actor, tenant=tenant) if (tenant := _tenant(tenant_id)) is not None else None
    if access is None:
        raise NotFound("No such tenant.")
    return access


def tenant_access_for_row(*, actor: User, row: Model | None, not_found: str) -> TenantAccess:
    """The actor's access to the tenant a row (a version, a run) belongs to. A row of a tenant the actor may
    not see is reported like a missing one, with the same message, so an id reveals nothing."""
    if row is None:
        raise NotFound(not_found)
    try:
        return tenant_access(actor=actor, tenant_id=row.tenant_id)
    except NotFound:
        raise NotFound(not_found) from None


def review_access(*, actor: User, tenant: Tenant, not_found: str = "No such sample.") -> TenantAccess:
    """Access to review a tenant's samples: PermissionDenied for members and viewers of its group (they know
    it exists); NotFound for anyone else who does not manage it, so that group samples do not leak."""
    access = _access_to(actor=actor, tenant=tenant)
    if access is None:
        raise NotFound(not_found)
    access.require_manage(message=REVIEW_FORBIDDEN)
    return access


def review_access_by_id(*, actor: User, tenant_id: int) -> TenantAccess:
    tenant = _tenant(tenant_id)
    if tenant is None:
        raise NotFound("No such tenant.")
    return review_access(actor=actor, tenant=tenant)


def review_access_for_row(*, actor: User, row: Model | None, not_found: str) -> TenantAccess:
    """Access to review the tenant of a row (a sample): a missing row is ``not_found``, like one of a tenant
    the actor may not see; members and viewers of its group get 403."""
    if row is None:
        raise NotFound(not_found)
    return review_access(actor=actor, tenant=row.tenant, not_found=not_found)


def review_access_for_tenants(*, actor: User, tenants: Iterable[Tenant]) -> dict[int, TenantAccess]:
    """Access to review each of several tenants (those of a bulk decision's samples), by tenant id, checked in
    the given order: the first the actor may not review refuses them all, as ``review_access`` refuses it."""
    return {tenant.pk: review_access(actor=actor, tenant=tenant) for tenant in tenants}


def managed_tenants(*, actor: User) -> QuerySet[Tenant]:
    """The tenants the actor manages, and so reviews (``TenantAccess.can_manage``, for lists): every tenant
    for staff; otherwise their personal tenant and the groups they own or administer; none when signed out."""
    if not actor.is_authenticated:
        return Tenant.objects.none()
    if actor.is_staff:
        return Tenant.objects.all()
    return Tenant.objects.filter(
        Q(kind=Tenant.Kind.USER, user=actor)
        | Q(kind=Tenant.Kind.GROUP, group__memberships__user=actor,
            group__memberships__role__in=_MANAGER_ROLES)
    )


def group_access(*, actor: User, slug: str, staff: bool = False) -> TenantAccess:
    """Access to a group's tenant by the group's slug. Non-members get 404 so that group names do not leak;
    with ``staff``, site staff reach every group (role ``staff``)."""
    if actor.is_authenticated and staff and actor.is_staff:
        tenant = (Tenant.objects.select_related("group").filter(kind=Tenant.Kind.GROUP, group__slug=slug)
                  .first())
        if tenant is not None:
            return TenantAccess(tenant=tenant, actor=actor, role=STAFF)
    membership = (
        Membership.objects.select_related("group__tenant").filter(group__slug=slug, user=actor).first()
        if actor.is_authenticated else None
    )
    if membership is None:
        raise NotFound("No such group.")
    return TenantAccess(tenant=membership.group.tenant, actor=actor, role=membership.role)


# --- API views ----------------------------------------------------------------------------------------------


# The base views carry comments, not docstrings: drf-spectacular describes an operation by the first docstring
# in its view's classes, and these would stand in for every view that has none.


class TenantApi(APIView):
    # An API view about one tenant, named in the URL by ``tenant_id``. Its handlers take ``access`` (a
    # ``TenantAccess``) in place of ``tenant_id``. ``access_by_id`` is the rule (review: review_access_by_id).

    access_by_id = staticmethod(tenant_access)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication, key scopes and throttles come first
        method = request.method.lower()
        if method == "options" or method not in self.http_method_names or not hasattr(self, method):
            return  # metadata and 405 answer as before, without resolving anything
        converted = self.convert_args(request, **kwargs)
        # DRF's dispatch calls the handler with the very dict it stored as self.kwargs: what convert_args
        # returns is what the handler gets.
        self.kwargs.clear()
        self.kwargs.update(converted)

    def convert_args(self, request: Request, *, tenant_id: int, **kwargs: Any) -> dict[str, Any]:
        return {**kwargs, "access": self.access_by_id(actor=request.user, tenant_id=tenant_id)}


class TenantRowApi(TenantApi):
    # An API view about one row of a tenant (a version, a run, a sample), named in the URL by ``row_kwarg``.
    # Its handlers take the row (as ``row_name``) and ``access`` to the row's tenant; a row of a tenant the
    # caller may not see answers 404 with ``not_found``, like a missing one. ``row_access`` is the rule
    # (review views: review_access_for_row).

    row_kwarg = ""
    row_name = ""
    not_found = "Not found."
    row_access = staticmethod(tenant_access_for_row)

    def get_row(self, pk: int) -> Model | None:
        raise NotImplementedError

    def convert_args(self, request: Request, **kwargs: Any) -> dict[str, Any]:
        row = self.get_row(kwargs.pop(self.row_kwarg))
        access = self.row_access(actor=request.user, row=row, not_found=self.not_found)
        return {**kwargs, self.row_name: row, "access": access}


class GroupApi(TenantApi):
    # An API view about one group, named in the URL by ``slug``: handlers take ``access`` (its tenant, the
    # caller's role) in place of the slug. Non-members, staff included, get 404 before anything else happens;
    # the services check the role again for the operation itself.

    def convert_args(self, request: Request, *, slug: str, **kwargs: Any) -> dict[str, Any]:
        return {**kwargs, "access": group_access(actor=request.user, slug=slug)}


# --- pages --------------------------------------------------------------------------------------------------


def tenant_page(view: Callable | None = None, *, access_by_id: Callable[..., TenantAccess] = tenant_access):
    """A page about one tenant (``tenant_id`` in the URL) gets ``access`` in its place: ``@tenant_page``, or
    ``@tenant_page(access_by_id=review_access_by_id)`` for another rule. Put it under ``page_errors``, which
    renders the 404 and 403."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def page(request, tenant_id: int, **kwargs: Any):
            return view(request, access=access_by_id(actor=request.user, tenant_id=tenant_id), **kwargs)

        return page

    return decorate(view) if view is not None else decorate


def tenant_row_page(
    *, kwarg: str, name: str, get_row: Callable[[int], Model | None], not_found: str,
    row_access: Callable[..., TenantAccess] = tenant_access_for_row,
) -> Callable[[Callable], Callable]:
    """A page about one row of a tenant (``kwarg`` in the URL) gets the row as ``name`` and ``access`` to its
    tenant; a row of a tenant the user may not see is a 404 like a missing one."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def page(request, **kwargs: Any):
            row = get_row(kwargs.pop(kwarg))
            access = row_access(actor=request.user, row=row, not_found=not_found)
            return view(request, **{**kwargs, name: row, "access": access})

        return page

    return decorate
