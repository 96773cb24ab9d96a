from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.groups.models import Role
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.selectors import key_resolve
from clawhub.keys.services import key_revoke, key_rotate
from tests.factories import add_member, make_group, make_key, make_user

pytestmark = pytest.mark.django_db


def test_personal_key_resolves_to_its_owner_and_personal_tenant():
    owner = make_user()
    key, secret = make_key(owner)
    resolved = key_resolve(secret=secret)
    assert resolved.key.pk == key.pk
    assert resolved.user == owner
    assert resolved.tenant == owner.tenant


def test_group_key_resolves_to_the_group_tenant():
    group = make_group()
    member = add_member(group, role=Role.MEMBER)
    _, secret = make_key(member, group=group)
    assert key_resolve(secret=secret).tenant == group.tenant


def test_resolve_is_one_query(django_assert_num_queries):
    _, secret = make_key()
    with django_assert_num_queries(1):
        resolved = key_resolve(secret=secret)
        assert resolved.tenant.pk and resolved.user.email


def test_lifecycle_rotate_grace_then_fail(settings):
    settings.KEY_ROTATION_GRACE = timedelta(hours=24)
    owner = make_user()
    key, old = make_key(owner)
    new = key_rotate(key=key, actor=owner)
    assert new != old
    assert key_resolve(secret=new).key.pk == key.pk
    assert key_resolve(secret=old).key.pk == key.pk  # inside the grace window, same stable id
    ApiKeySecret.objects.filter(key=key, valid_until__isnull=False).update(
        valid_until=timezone.now() - timedelta(seconds=1)
    )
    assert key_resolve(secret=old) is None
    assert key_resolve(secret=new).key.pk == key.pk


def test_expired_and_revoked_keys_do_not_resolve():
    owner = make_user()
    key, secret = make_key(owner)
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert key_resolve(secret=secret) is None
    key2, secret2 = make_key(owner)
    key_revoke(key=key2, actor=owner)
    assert key_resolve(secret=secret2) is None


def test_unknown_or_malformed_secret_does_not_resolve():
    make_key()
    assert key_resolve(secret="chk_" + "x" * 43) is None
    assert key_resolve(secret="sk-not-ours") is None
    assert key_resolve(secret="") is None


def test_clear_secret_is_stored_nowhere():
    key, secret = make_key()
    for row in ApiKey.objects.filter(pk=key.pk).values():
        assert all(secret not in str(value) for value in row.values())
    for row in ApiKeySecret.objects.filter(key=key).values():
        assert all(secret not in str(value) for value in row.values())


# models_for_key, keys_for_group, bindable groups

def test_models_for_personal_and_group_keys():
    from clawhub.keys.selectors import models_for_key

    owner = make_user()
    personal, _ = make_key(owner)
    assert models_for_key(personal) == ["clawhub-personal", "base"]
    group = make_group(owner, name="Night Shift")
    bound, _ = make_key(owner, group=group)
    assert models_for_key(bound) == ["clawhub-group-night-shift", "base"]
    only_base, _ = make_key(owner, group=group, allowed_models=["base"])
    assert models_for_key(only_base) == ["base"]


def test_models_for_key_costs_no_query_with_a_resolved_key(django_assert_num_queries):
    from clawhub.keys.selectors import models_for_key

    group = make_group()
    _, secret = make_key(group.created_by, group=group)
    resolved = key_resolve(secret=secret)
    with django_assert_num_queries(0):
        assert models_for_key(resolved.key, tenant=resolved.tenant)[0] == f"clawhub-group-{group.slug}"


def test_keys_for_group_lists_only_that_groups_keys_for_admins():
    from clawhub.core.exceptions import PermissionDenied
    from clawhub.keys.selectors import keys_for_group

    group = make_group()
    admin = add_member(group, role=Role.ADMIN)
    member = add_member(group, role=Role.MEMBER)
    bound, _ = make_key(member, group=group)
    make_key(member)  # personal: not the group's business
    make_key(make_group().created_by)
    assert [k.pk for k in keys_for_group(group=group, actor=admin)] == [bound.pk]
    assert [k.pk for k in keys_for_group(group=group, actor=group.created_by)] == [bound.pk]
    with pytest.raises(PermissionDenied):
        keys_for_group(group=group, actor=member)


def test_groups_for_key_binding_excludes_viewer_groups():
    from clawhub.keys.selectors import groups_for_key_binding

    user = make_user()
    mine = make_group(user, name="A")
    member_of = make_group(name="B")
    add_member(member_of, user, Role.MEMBER)
    viewer_of = make_group(name="C")
    add_member(viewer_of, user, Role.VIEWER)
    assert list(groups_for_key_binding(user=user)) == [mine, member_of]
