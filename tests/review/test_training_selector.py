"""samples_for_training: what a training run may take, in which order, and how much per member."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.accounts.models import User
from clawhub.keys.models import ApiKey
from clawhub.privacy.services import sample_delete_own
from clawhub.review.models import Sample
from clawhub.review.selectors import samples_for_training, trainable_count
from tests.factories import add_member, make_group, make_run, make_user
from tests.review.conftest import approved_sample, old_key

pytestmark = pytest.mark.django_db


def ago(minutes: int):
    return timezone.now() - timedelta(minutes=minutes)


def test_oldest_first_approved_only_and_limited():
    user = make_user()
    key = old_key(user)
    samples = [approved_sample(user, key=key, created_at=ago(100 - i)) for i in range(5)]
    pending = approved_sample(user, key=key, created_at=ago(500))
    rejected = approved_sample(user, key=key, created_at=ago(501))
    Sample.objects.filter(pk=pending.pk).update(state="pending")
    Sample.objects.filter(pk=rejected.pk).update(state="rejected")
    batch = samples_for_training(tenant=user.tenant, limit=3)
    assert [s.pk for s in batch] == [s.pk for s in samples[:3]]
    # Personal tenants have no per-member cap: one member is the whole tenant.
    assert len(samples_for_training(tenant=user.tenant, limit=10)) == 5


def test_claimed_and_trained_samples_are_not_offered_again():
    user = make_user()
    key = old_key(user)
    a, b, c = (approved_sample(user, key=key, created_at=ago(10 - i)) for i in range(3))
    Sample.objects.filter(pk=a.pk).update(training_run=make_run(user.tenant))
    Sample.objects.filter(pk=b.pk).update(trained_at=timezone.now())
    assert [s.pk for s in samples_for_training(tenant=user.tenant)] == [c.pk]


def test_deleted_samples_never_reach_the_selector():
    user = make_user()
    key = old_key(user)
    kept, gone = approved_sample(user, key=key), approved_sample(user, key=key)
    sample_delete_own(actor=user, sample_id=gone.pk)
    assert [s.pk for s in samples_for_training(tenant=user.tenant)] == [kept.pk]


def test_keys_and_users_with_training_off_never_reach_the_selector():
    owner = make_user()
    group = make_group(owner)
    alice, bob = add_member(group), add_member(group)
    alice_on, alice_off = old_key(alice, group=group), old_key(alice, group=group)
    bob_key = old_key(bob, group=group)
    keep = approved_sample(alice, key=alice_on)
    approved_sample(alice, key=alice_off)
    approved_sample(bob, key=bob_key)
    ApiKey.objects.filter(pk=alice_off.pk).update(training_enabled=False)
    User.objects.filter(pk=bob.pk).update(training_enabled=False)
    assert [s.pk for s in samples_for_training(tenant=group.tenant, limit=10)] == [keep.pk]
    assert trainable_count(tenant=group.tenant) == 1
    # Switched back on, they are offered again (nothing was destroyed).
    User.objects.filter(pk=bob.pk).update(training_enabled=True)
    assert len(samples_for_training(tenant=group.tenant, limit=10)) == 2


def test_other_tenants_samples_are_never_offered():
    user, other = make_user(), make_user()
    approved_sample(other, key=old_key(other))
    assert samples_for_training(tenant=user.tenant) == []


def test_per_member_cap_in_a_group():
    owner = make_user()
    group = make_group(owner)
    heavy, light = add_member(group), add_member(group)
    heavy_key, light_key = old_key(heavy, group=group), old_key(light, group=group)
    # The heavy member's ten samples are all older than the light member's three.
    heavy_samples = [approved_sample(heavy, key=heavy_key, created_at=ago(100 - i)) for i in range(10)]
    light_samples = [approved_sample(light, key=light_key, created_at=ago(50 - i)) for i in range(3)]
    batch = samples_for_training(tenant=group.tenant, limit=8, member_cap=0.5)
    # ceil(0.5 × 8) = 4 for the heavy member, all 3 of the light one; still oldest first.
    assert [s.pk for s in batch] == [s.pk for s in heavy_samples[:4]] + [s.pk for s in light_samples]
    by_member = {u: sum(1 for s in batch if s.user_id == u.pk) for u in (heavy, light)}
    assert by_member == {heavy: 4, light: 3}
    # A looser cap lets the heavy member fill more; the limit still holds.
    loose = samples_for_training(tenant=group.tenant, limit=8, member_cap=0.75)
    assert len(loose) == 8 and sum(1 for s in loose if s.user_id == heavy.pk) == 6
    # The default comes from settings: 16 × 0.5 = 8.
    assert sum(1 for s in samples_for_training(tenant=group.tenant) if s.user_id == heavy.pk) == 8


def test_cap_after_earlier_batches_were_claimed():
    owner = make_user()
    group = make_group(owner)
    member = add_member(group)
    key = old_key(member, group=group)
    samples = [approved_sample(member, key=key, created_at=ago(100 - i)) for i in range(6)]
    Sample.objects.filter(pk__in=[s.pk for s in samples[:2]]).update(training_run=make_run(group.tenant))
    # Claimed samples do not count against the member's share of the next batch.
    assert [s.pk for s in samples_for_training(tenant=group.tenant, limit=4)] == [s.pk for s in samples[2:4]]
