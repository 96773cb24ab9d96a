"""Writes for groups, memberships and invitations."""

from django.db import transaction
from django.utils.text import slugify

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record
from clawhub.core.exceptions import Conflict, ValidationFailed
from clawhub.groups.models import Group, Membership, Role


@transaction.atomic
def group_create(*, actor: User, name: str, slug: str = "", ip: str | None = None) -> Group:
    """Creates a group, its tenant (shared adapter) and the creator's owner membership."""
    from clawhub.tenants.models import Tenant

    name = (name or "").strip()
    if not name:
        raise ValidationFailed("A group needs a name.", field="name")
    slug = slugify(slug or name)[:60]
    if not slug:
        raise ValidationFailed("The group name needs at least one letter or digit.", field="slug")
    if Group.objects.filter(slug=slug).exists():
        raise Conflict("A group with this slug already exists.", code="slug_taken", field="slug")
    group = Group.objects.create(name=name, slug=slug, created_by=actor)
    Tenant.objects.create(kind=Tenant.Kind.GROUP, group=group)
    Membership.objects.create(group=group, user=actor, role=Role.OWNER)
    audit_record(actor=actor, action="group.create", target=group, subject_user=actor, group=group, ip=ip)
    return group
