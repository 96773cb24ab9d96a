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
