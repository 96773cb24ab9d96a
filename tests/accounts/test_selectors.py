import pytest

from clawhub.accounts.selectors import (
    audit_all,
    audit_for_group,
    audit_for_user,
    audit_groups_for,
    audit_ip_visible,
    audit_list,
    user_get_by_email,
)
from clawhub.accounts.services import audit_record
from clawhub.core.exceptions import NotFound, PermissionDenied
from tests.factories import make_group, make_user

pytestmark = pytest.mark.django_db


def test_user_get_by_email_ignores_case_and_spaces():
    user = make_user("Case@example.com")
    assert user_get_by_email(email="  CASE@EXAMPLE.COM ") == user
    assert user_get_by_email(email="other@example.com") is None


def test_audit_for_user_has_what_they_did_and_what_was_done_to_them():
    me, other = make_user(), make_user()
    did = audit_record(actor=me, action="test.did", target=other)
    done_to = audit_record(actor=other, action="test.done_to", target=me, subject_user=me)
    audit_record(actor=other, action="test.unrelated", target=other, subject_user=other)
    assert set(audit_for_user(user=me)) == {did, done_to}


@pytest.mark.parametrize("role, allowed, error", [
    ("owner", True, None), ("admin", True, None), ("staff", True, None),
    ("member", False, PermissionDenied), ("viewer", False, PermissionDenied), ("outsider", False, NotFound),
])
def test_audit_for_group_by_role(roles, role, allowed, error):
    group, other_group = roles["group"], make_group()
    if allowed:
        rows = list(audit_for_group(group=group, user=roles[role]))
        assert rows and all(row.group_id == group.pk for row in rows)
        assert other_group.pk not in {row.group_id for row in rows}
    else:
        with pytest.raises(error):
            audit_for_group(group=group, user=roles[role])


def test_audit_all_is_staff_only(roles):
    with pytest.raises(PermissionDenied):
        audit_all(user=roles["owner"])
    assert audit_all(user=roles["staff"]).count() >= 1


def test_audit_list_unknown_group_is_not_found(roles):
    with pytest.raises(NotFound):
        audit_list(user=roles["staff"], group_slug="missing")


def test_audit_groups_for_lists_only_groups_the_user_administers(roles):
    group = roles["group"]
    assert list(audit_groups_for(user=roles["admin"])) == [group]
    assert list(audit_groups_for(user=roles["member"])) == []
    make_group()
    assert audit_groups_for(user=roles["staff"]).count() == 2


def test_ip_is_visible_to_the_actor_and_staff_only(roles):
    row = audit_record(actor=roles["owner"], action="test", target=roles["group"], ip="10.0.0.1")
    assert audit_ip_visible(row=row, viewer=roles["owner"])
    assert audit_ip_visible(row=row, viewer=roles["staff"])
    assert not audit_ip_visible(row=row, viewer=roles["admin"])
    system_row = audit_record(actor=None, action="auth.lockout", target=None, ip="10.0.0.2")
    assert not audit_ip_visible(row=system_row, viewer=roles["admin"])
    assert system_row.target_type == "" and system_row.target_id == ""
