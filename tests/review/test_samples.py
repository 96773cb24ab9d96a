"""From judgment to sample: what becomes a sample, the guards against real rows, and the review policy."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clawhub.conversations.models import Turn
from clawhub.keys.models import ApiKey
from clawhub.review import flags
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.review.services import next_state_digest, sample_create_for_judgment
from tests.factories import add_member, make_group, make_key, make_user
from tests.review.conftest import make_judgment, make_sample, make_turn, old_key

pytestmark = pytest.mark.django_db


def codes(sample: Sample) -> list[str]:
    return sorted(sample.flag_codes)


class TestWhatBecomesASample:
    def test_a_scored_main_turn_becomes_an_approved_sample_on_a_personal_tenant(self):
        user = make_user()
        key = old_key(user)
        sample = make_sample(user, key=key, reward=1)
        assert sample is not None
        assert (sample.tenant, sample.user, sample.key, sample.reward) == (user.tenant, user, key, 1)
        assert sample.state == Sample.State.APPROVED and sample.flags == []
        assert sample.judgment.turn_id == sample.turn_id

    def test_reward_zero_without_hint_teaches_nothing(self):
        user = make_user()
        assert make_sample(user, key=old_key(user), reward=0) is None
        assert not Sample.objects.exists()

    def test_reward_zero_with_a_hint_is_kept(self):
        user = make_user()
        sample = make_sample(user, key=old_key(user), reward=0, votes=[0, 0, 0],
                             hints=["The user wants plain sentences without bold text."])
        assert sample is not None and sample.has_hint and sample.reward == 0

    def test_side_turns_never_become_samples(self):
        user = make_user()
        assert make_sample(user, key=old_key(user), turn_type=Turn.Type.SIDE) is None

    def test_failed_judgments_never_become_samples(self):
        user = make_user()
        turn = make_turn(user, key=old_key(user))
        judgment = make_judgment(turn, reward=1, status="failed")
        assert sample_create_for_judgment(judgment_id=judgment.pk) is None

    def test_user_with_training_off(self):
        user = make_user(training_enabled=False)
        assert make_sample(user, key=old_key(user)) is None

    def test_key_with_training_off(self):
        user = make_user()
        key = old_key(user)
        ApiKey.objects.filter(pk=key.pk).update(training_enabled=False)
        key.refresh_from_db()
        assert make_sample(user, key=key) is None

    def test_idempotent(self):
        user = make_user()
        turn = make_turn(user, key=old_key(user))
        judgment = make_judgment(turn, reward=-1)
        first = sample_create_for_judgment(judgment_id=judgment.pk)
        again = sample_create_for_judgment(judgment_id=judgment.pk)
        assert first.pk == again.pk and Sample.objects.count() == 1

    def test_unknown_judgment(self):
        assert sample_create_for_judgment(judgment_id=999999) is None


class TestGuardsOnRealRows:
    def test_new_key_in_a_group(self):
        group = make_group()
        member = add_member(group)
        key, _ = make_key(member, group=group)  # created just now
        sample = make_sample(member, key=key)
        assert flags.NEW_KEY in codes(sample)
        assert sample.state == Sample.State.PENDING

    def test_new_key_on_a_personal_adapter_is_not_flagged_by_default(self):
        user = make_user()
        key, _ = make_key(user)  # created just now: a newcomer's first feedback trains at once
        sample = make_sample(user, key=key)
        assert codes(sample) == []
        assert sample.state == Sample.State.APPROVED

    def test_new_key_on_a_personal_adapter_when_the_user_sets_an_age(self):
        user = make_user()
        ReviewPolicy.objects.create(tenant=user.tenant, mode=ReviewPolicy.Mode.AUTO,
                                    new_key_age=timedelta(hours=1))
        key, _ = make_key(user)
        sample = make_sample(user, key=key)
        assert codes(sample) == [flags.NEW_KEY]
        assert sample.state == Sample.State.PENDING

    def test_revoked_key(self):
        user = make_user()
        key = old_key(user)
        ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now() - timedelta(minutes=5))
        key.refresh_from_db()
        assert codes(make_sample(user, key=key)) == [flags.REVOKED_KEY]

    def test_split_votes(self):
        user = make_user()
        assert codes(make_sample(user, key=old_key(user), reward=1, votes=[1, 1, -1])) == [flags.SPLIT_VOTES]

    def test_near_duplicate_spam(self):
        user = make_user()
        key = old_key(user)
        results = [make_sample(user, key=key, reward=-1, next_text=text)
                   for text in ("Wrong! Redo it.", "wrong, redo it", "WRONG redo it", "something else")]
        assert [codes(s) for s in results] == [[], [], [flags.NEAR_DUPLICATE], []]
        expected = next_state_digest([{"role": "user", "content": "wrong redo it"}])
        assert results[0].next_state_digest == expected

    def test_near_duplicate_window(self):
        user = make_user()
        key = old_key(user)
        first, second = (make_sample(user, key=key, next_text="same text") for _ in range(2))
        two_days_ago = timezone.now() - timedelta(days=2)
        Sample.objects.filter(pk__in=[first.pk, second.pk]).update(created_at=two_days_ago)
        assert codes(make_sample(user, key=key, next_text="same text")) == []

    def test_member_outlier_in_a_group(self):
        owner = make_user()
        group = make_group(owner)
        calm = [add_member(group) for _ in range(2)]
        for member in calm:
            key = old_key(member, group=group)
            for i in range(6):
                make_sample(member, key=key, reward=1 if i else -1)
        angry = add_member(group)
        key = old_key(angry, group=group)
        # Replies of a style the calm members' replies do not have, so that only this guard looks at them.
        results = [make_sample(angry, key=key, reward=-1, reply="**Done.**") for _ in range(5)]
        # Four samples are below the minimum; the fifth makes a 100% negative rate against each calm member's
        # 17% (z = 2.76 over 5 and 6 samples).
        assert [codes(s) for s in results[:4]] == [[]] * 4
        assert codes(results[4]) == [flags.MEMBER_OUTLIER]
        assert results[4].state == Sample.State.PENDING

    def test_outlier_guard_does_not_apply_to_personal_tenants(self):
        user = make_user()
        key = old_key(user)
        assert all(codes(make_sample(user, key=key, reward=-1)) == [] for _ in range(8))


class TestPolicy:
    def test_group_defaults_to_flagged(self, team):
        clean = make_sample(team["author"], key=team["author_key"], reward=1)
        split = make_sample(team["author"], key=team["author_key"], reward=1, votes=[1, -1, 1])
        assert (clean.state, split.state) == (Sample.State.APPROVED, Sample.State.PENDING)

    def test_manual_holds_everything(self, team):
        ReviewPolicy.objects.create(tenant=team["tenant"], mode=ReviewPolicy.Mode.MANUAL)
        assert make_sample(team["author"], key=team["author_key"], reward=1).state == Sample.State.PENDING

    def test_auto_approves_unflagged(self):
        user = make_user()
        ReviewPolicy.objects.create(tenant=user.tenant, mode=ReviewPolicy.Mode.AUTO)
        assert make_sample(user, key=old_key(user)).state == Sample.State.APPROVED
        assert make_sample(user, key=old_key(user), votes=[1, 0, 1]).state == Sample.State.PENDING

    def test_thresholds_come_from_the_policy(self):
        user = make_user()
        ReviewPolicy.objects.create(tenant=user.tenant, mode=ReviewPolicy.Mode.AUTO,
                                    new_key_age=timedelta(minutes=0))
        key, _ = make_key(user)
        assert make_sample(user, key=key).flags == []
