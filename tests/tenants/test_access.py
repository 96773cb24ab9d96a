"""clawhub.tenants.access: one TenantAccess per request, the rules each kind of view applies, and the base
views that hand it to the handlers."""

import pytest
from rest_framework.test import APIClient

from clawhub.core.exceptions import NotFound, PermissionDenied
from clawhub.groups.models import Role
from clawhub.tenants.access import group_access, review_access, tenant_access, tenant_access_for_row
from tests.factories import make_run, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(every_role):
    """The group with one user of each role (tests/conftest.py)."""
    return every_role


def test_roles_and_who_manages_a_group_tenant(team):
    tenant = team["group"].tenant
    seen = {who: tenant_access(actor=team[who], tenant_id=tenant.pk)
            for who in ("owner", "admin", "member", "viewer", "staff")}
    assert {who: a.role for who, a in seen.items()} == {
        "owner": "owner", "admin": "admin", "member": "member", "viewer": "viewer", "staff": "staff"}
    assert {who: a.can_manage for who, a in seen.items()} == {
        "owner": True, "admin": True, "member": False, "viewer": False, "staff": True}
    assert seen["member"].group == team["group"] and seen["staff"].group_role is None
    with pytest.raises(PermissionDenied, match="may pin"):
        seen["viewer"].require_manage("pin")
    with pytest.raises(NotFound, match="No such tenant."):
        tenant_access(actor=team["other"], tenant_id=tenant.pk)


def test_a_personal_tenant_is_its_users_and_staffs_only(team):
    user = make_user()
    assert tenant_access(actor=user, tenant_id=user.tenant.pk).role == "self"
    assert tenant_access(actor=team["staff"], tenant_id=user.tenant.pk).role == "staff"
    for outsider in (team["owner"], team["other"]):
        with pytest.raises(NotFound):
            tenant_access(actor=outsider, tenant_id=user.tenant.pk)
    with pytest.raises(NotFound, match="No such tenant."):
        tenant_access(actor=user, tenant_id=user.tenant.pk + 10_000)


def test_a_row_of_a_hidden_tenant_reads_like_a_missing_row(team):
    run = make_run(team["group"].tenant)
    assert tenant_access_for_row(actor=team["viewer"], row=run, not_found="No such run.").role == "viewer"
    for row in (run, None):
        with pytest.raises(NotFound, match="No such run."):
            tenant_access_for_row(actor=team["other"], row=row, not_found="No such run.")


def test_review_needs_the_right_to_manage_members_get_403_and_outsiders_404(team):
    tenant = team["group"].tenant
    assert review_access(actor=team["admin"], tenant=tenant).can_manage
    assert review_access(actor=team["staff"], tenant=tenant).role == "staff"
    for who in ("member", "viewer"):
        with pytest.raises(PermissionDenied, match="review its samples"):
            review_access(actor=team[who], tenant=tenant)
    with pytest.raises(NotFound, match="No such sample."):
        review_access(actor=team["other"], tenant=tenant)


def test_groups_by_slug_answer_404_to_non_members_and_to_staff_unless_asked(team):
    slug = team["group"].slug
    access = group_access(actor=team["member"], slug=slug)
    assert (access.tenant, access.group_role) == (team["group"].tenant, Role.MEMBER)
    for who in ("other", "staff"):
        with pytest.raises(NotFound, match="No such group."):
            group_access(actor=team[who], slug=slug)
    assert group_access(actor=team["staff"], slug=slug, staff=True).role == "staff"
    with pytest.raises(NotFound):
        group_access(actor=team["staff"], slug="no-such-group", staff=True)


def test_the_base_view_hands_the_handler_the_access_and_leaves_405_and_options_alone(team):
    client = APIClient()
    client.force_authenticate(team["other"])
    url = f"/api/training/tenants/{team['group'].tenant.pk}/runs/"
    assert client.get(url).status_code == 404  # a tenant the caller may not see
    assert client.delete(url).status_code == 405  # no such operation, whoever asks
    assert client.options(url).status_code == 200
    client.force_authenticate(team["viewer"])
    assert client.get(url).json()["results"] == []
    assert client.post(f"/api/training/tenants/{team['group'].tenant.pk}/runs/start/").status_code == 403
