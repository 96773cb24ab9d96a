import pytest

from clawhub.accounts.models import AuditLog
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from clawhub.groups.models import Group, Membership, Role
from clawhub.groups.selectors import group_members, groups_for_user, role_of
from clawhub.groups.services import (
    group_delete,
    group_transfer_ownership,
    group_update,
    membership_change_role,
    membership_leave,
    membership_remove,
)
from clawhub.keys.models import ApiKey
from clawhub.keys.selectors import key_resolve
from clawhub.keys.services import key_create
from clawhub.tenants.models import Tenant

pytestmark = pytest.mark.django_db


def audit_rows(action: str):
    return AuditLog.objects.filter(action=action)


# --- group_update -------------------------------------------------------------------------------------------


def test_admin_renames_the_group_and_the_slug_stays(crew):
    group_update(actor=crew.admin, group=crew.group, name="  The Crew  ", ip="10.0.0.1")
    crew.group.refresh_from_db()
    assert crew.group.name == "The Crew"
    assert crew.group.slug == "crew"
    row = audit_rows("group.update").get()
    assert (row.actor, row.group, row.ip) == (crew.admin, crew.group, "10.0.0.1")
    assert row.data["old_name"] == "Crew"


@pytest.mark.parametrize("who, error", [("member", PermissionDenied), ("viewer", PermissionDenied),
                                         ("outsider", NotFound)])
def test_rename_refused_below_admin(crew, who, error):
    with pytest.raises(error):
        group_update(actor=crew.as_role(who), group=crew.group, name="Hijacked")
    crew.group.refresh_from_db()
    assert crew.group.name == "Crew"


def test_rename_needs_a_name(crew):
    with pytest.raises(ValidationFailed):
        group_update(actor=crew.owner, group=crew.group, name="   ")


# --- group_delete -------------------------------------------------------------------------------------------


def test_owner_deletes_group_revoking_its_keys_and_tenant(crew, django_capture_on_commit_callbacks):
    _, member_secret = key_create(owner=crew.member, name="m", group=crew.group)
    _, admin_secret = key_create(owner=crew.admin, name="a", group=crew.group)
    _, personal_secret = key_create(owner=crew.member, name="personal")
    group_id = crew.group.pk
    with django_capture_on_commit_callbacks(execute=True):
        group_delete(actor=crew.owner, group=crew.group)
    assert not Group.objects.filter(pk=group_id).exists()
    assert not Tenant.objects.filter(group_id=group_id).exists()
    assert not Membership.objects.filter(group_id=group_id).exists()
    assert key_resolve(secret=member_secret) is None
    assert key_resolve(secret=admin_secret) is None
    assert key_resolve(secret=personal_secret) is not None
    # Each key's revocation is audited, and the group's deletion keeps its slug though the group link is gone.
    assert audit_rows("key.revoke").count() == 2
    row = audit_rows("group.delete").get()
    assert row.data["slug"] == "crew" and row.data["keys_revoked"] == 2


@pytest.mark.parametrize("who, error", [("admin", PermissionDenied), ("member", PermissionDenied),
                                         ("viewer", PermissionDenied), ("outsider", NotFound)])
def test_only_the_owner_deletes(crew, who, error):
    with pytest.raises(error):
        group_delete(actor=crew.as_role(who), group=crew.group)
    assert Group.objects.filter(pk=crew.group.pk).exists()


# --- group_transfer_ownership -------------------------------------------------------------------------------


def test_transfer_makes_member_owner_and_old_owner_admin(crew):
    group_transfer_ownership(actor=crew.owner, group=crew.group, new_owner=crew.viewer, ip="10.0.0.2")
    assert role_of(group=crew.group, user=crew.viewer) == Role.OWNER
    assert role_of(group=crew.group, user=crew.owner) == Role.ADMIN
    assert Membership.objects.filter(group=crew.group, role=Role.OWNER).count() == 1
    row = audit_rows("group.transfer_ownership").get()
    assert row.subject_user == crew.viewer and row.actor == crew.owner
    # The powers moved with it: the new owner may delete, the old one may now leave but not delete.
    with pytest.raises(PermissionDenied):
        group_delete(actor=crew.owner, group=crew.group)
    membership_leave(actor=crew.owner, group=crew.group)
    assert role_of(group=crew.group, user=crew.owner) is None
    group_delete(actor=crew.viewer, group=crew.group)


def test_transfer_refusals(crew):
    with pytest.raises(PermissionDenied):
        group_transfer_ownership(actor=crew.admin, group=crew.group, new_owner=crew.admin)
    with pytest.raises(ValidationFailed):
        group_transfer_ownership(actor=crew.owner, group=crew.group, new_owner=crew.outsider)
    with pytest.raises(Conflict):
        group_transfer_ownership(actor=crew.owner, group=crew.group, new_owner=crew.owner)
    with pytest.raises(NotFound):
        group_transfer_ownership(actor=crew.outsider, group=crew.group, new_owner=crew.outsider)
    assert role_of(group=crew.group, user=crew.owner) == Role.OWNER


# --- membership_change_role ---------------------------------------------------------------------------------


def test_admin_switches_members_and_viewers(crew):
    membership_change_role(actor=crew.admin, group=crew.group, user=crew.target, role=Role.VIEWER)
    assert role_of(group=crew.group, user=crew.target) == Role.VIEWER
    membership_change_role(actor=crew.admin, group=crew.group, user=crew.target, role="member")
    assert role_of(group=crew.group, user=crew.target) == Role.MEMBER
    rows = list(audit_rows("membership.change_role").order_by("created_at", "id"))
    assert [(r.subject_user, r.data["old_role"], r.data["role"]) for r in rows] == [
        (crew.target, "member", "viewer"), (crew.target, "viewer", "member"),
    ]


def test_only_the_owner_promotes_and_demotes_admins(crew):
    with pytest.raises(PermissionDenied):
        membership_change_role(actor=crew.admin, group=crew.group, user=crew.target, role=Role.ADMIN)
    with pytest.raises(PermissionDenied):
        membership_change_role(actor=crew.admin, group=crew.group, user=crew.admin2, role=Role.MEMBER)
    with pytest.raises(PermissionDenied):
        membership_change_role(actor=crew.admin, group=crew.group, user=crew.admin, role=Role.MEMBER)
    membership_change_role(actor=crew.owner, group=crew.group, user=crew.target, role=Role.ADMIN)
    assert role_of(group=crew.group, user=crew.target) == Role.ADMIN
    membership_change_role(actor=crew.owner, group=crew.group, user=crew.admin2, role=Role.VIEWER)
    assert role_of(group=crew.group, user=crew.admin2) == Role.VIEWER


def test_role_change_refusals(crew):
    with pytest.raises(PermissionDenied):
        membership_change_role(actor=crew.member, group=crew.group, user=crew.target, role=Role.VIEWER)
    with pytest.raises(PermissionDenied):
        membership_change_role(actor=crew.viewer, group=crew.group, user=crew.target, role=Role.VIEWER)
    with pytest.raises(NotFound):
        membership_change_role(actor=crew.outsider, group=crew.group, user=crew.target, role=Role.VIEWER)
    with pytest.raises(PermissionDenied):  # the owner's role only moves by transfer
        membership_change_role(actor=crew.owner, group=crew.group, user=crew.owner, role=Role.ADMIN)
    with pytest.raises(ValidationFailed):  # nor can anyone be made owner this way: exactly one owner
        membership_change_role(actor=crew.owner, group=crew.group, user=crew.target, role=Role.OWNER)
    with pytest.raises(ValidationFailed):
        membership_change_role(actor=crew.owner, group=crew.group, user=crew.target, role="superuser")
    with pytest.raises(NotFound):
        membership_change_role(actor=crew.owner, group=crew.group, user=crew.outsider, role=Role.VIEWER)
    assert role_of(group=crew.group, user=crew.target) == Role.MEMBER
    assert Membership.objects.filter(group=crew.group, role=Role.OWNER).get().user == crew.owner


def test_demotion_to_viewer_revokes_group_keys_only(crew):
    group_key, group_secret = key_create(owner=crew.target, name="g", group=crew.group)
    _, personal_secret = key_create(owner=crew.target, name="p")
    _, other_secret = key_create(owner=crew.member, name="m", group=crew.group)
    membership_change_role(actor=crew.admin, group=crew.group, user=crew.target, role=Role.VIEWER)
    assert key_resolve(secret=group_secret) is None
    assert key_resolve(secret=personal_secret) is not None
    assert key_resolve(secret=other_secret) is not None
    assert ApiKey.objects.get(pk=group_key.pk).revoked_at is not None
    # Promotion back does not bring the key back; a viewer cannot bind a new one meanwhile.
    membership_change_role(actor=crew.admin, group=crew.group, user=crew.target, role=Role.MEMBER)
    assert key_resolve(secret=group_secret) is None


def test_viewer_cannot_bind_a_key(crew):
    with pytest.raises(PermissionDenied):
        key_create(owner=crew.viewer, name="v", group=crew.group)


# --- membership_remove / membership_leave -------------------------------------------------------------------


def test_admin_removes_a_member_and_their_group_keys_stop_resolving(crew, django_capture_on_commit_callbacks):
    _, target_group_secret = key_create(owner=crew.target, name="g", group=crew.group)
    _, target_personal_secret = key_create(owner=crew.target, name="p")
    _, member_secret = key_create(owner=crew.member, name="m", group=crew.group)
    assert key_resolve(secret=target_group_secret).tenant == crew.group.tenant
    with django_capture_on_commit_callbacks(execute=True):
        membership_remove(actor=crew.admin, group=crew.group, user=crew.target, ip="10.0.0.3")
    assert role_of(group=crew.group, user=crew.target) is None
    assert key_resolve(secret=target_group_secret) is None
    assert key_resolve(secret=target_personal_secret) is not None
    assert key_resolve(secret=member_secret) is not None
    row = audit_rows("membership.remove").get()
    assert (row.actor, row.subject_user, row.group) == (crew.admin, crew.target, crew.group)
    assert row.ip == "10.0.0.3"
    assert row.data["keys_revoked"] == 1


def test_admin_removes_viewers_but_only_the_owner_removes_admins(crew):
    membership_remove(actor=crew.admin, group=crew.group, user=crew.viewer)
    assert role_of(group=crew.group, user=crew.viewer) is None
    with pytest.raises(PermissionDenied):
        membership_remove(actor=crew.admin, group=crew.group, user=crew.admin2)
    assert role_of(group=crew.group, user=crew.admin2) == Role.ADMIN
    membership_remove(actor=crew.owner, group=crew.group, user=crew.admin2)
    assert role_of(group=crew.group, user=crew.admin2) is None


def test_remove_refusals(crew):
    with pytest.raises(PermissionDenied):
        membership_remove(actor=crew.admin, group=crew.group, user=crew.owner)
    with pytest.raises(PermissionDenied):
        membership_remove(actor=crew.member, group=crew.group, user=crew.viewer)
    with pytest.raises(PermissionDenied):
        membership_remove(actor=crew.viewer, group=crew.group, user=crew.member)
    with pytest.raises(NotFound):
        membership_remove(actor=crew.outsider, group=crew.group, user=crew.member)
    with pytest.raises(NotFound):
        membership_remove(actor=crew.owner, group=crew.group, user=crew.outsider)
    assert group_members(group=crew.group).count() == 6


def test_removing_yourself_is_leaving(crew):
    membership_remove(actor=crew.member, group=crew.group, user=crew.member)
    assert role_of(group=crew.group, user=crew.member) is None
    assert audit_rows("membership.leave").get().subject_user == crew.member


@pytest.mark.parametrize("who", ["admin", "member", "viewer"])
def test_members_leave_and_their_group_keys_are_revoked(crew, who):
    user = crew.as_role(who)
    secret = key_create(owner=user, name="k", group=crew.group)[1] if who != "viewer" else None
    membership_leave(actor=user, group=crew.group)
    assert role_of(group=crew.group, user=user) is None
    assert crew.group not in groups_for_user(user=user)
    if secret:
        assert key_resolve(secret=secret) is None


def test_owner_cannot_leave_without_transferring(crew):
    with pytest.raises(Conflict) as excinfo:
        membership_leave(actor=crew.owner, group=crew.group)
    assert excinfo.value.code == "owner_must_transfer"
    assert role_of(group=crew.group, user=crew.owner) == Role.OWNER


def test_outsider_cannot_leave(crew):
    with pytest.raises(NotFound):
        membership_leave(actor=crew.outsider, group=crew.group)


# --- selectors ----------------------------------------------------------------------------------------------


def test_groups_for_user_carries_the_users_role(crew):
    rows = {g.slug: g.my_role for g in groups_for_user(user=crew.admin)}
    assert rows == {"crew": "admin"}
    assert {g.slug: g.my_role for g in groups_for_user(user=crew.outsider)} == {"elsewhere": "owner"}


def test_groups_for_user_filters_by_the_users_own_role(crew):
    # The viewer's group has members and admins, but the viewer's own role is what counts.
    assert list(groups_for_user(user=crew.viewer, at_least=Role.MEMBER)) == []
    assert [g.slug for g in groups_for_user(user=crew.viewer, at_least=Role.VIEWER)] == ["crew"]
    assert [g.slug for g in groups_for_user(user=crew.member, at_least=Role.MEMBER)] == ["crew"]
    assert list(groups_for_user(user=crew.member, at_least=Role.ADMIN)) == []


def test_members_are_listed_owner_first(crew):
    members = list(group_members(group=crew.group))
    assert members[0].user == crew.owner
    assert [m.role for m in members] == ["owner", "admin", "admin", "member", "member", "viewer"]
