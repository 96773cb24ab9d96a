"""The poisoning guards and the review policy as pure functions."""

from datetime import UTC, datetime, timedelta

import pytest

from clawhub.review import flags
from clawhub.review.flags import MemberStats

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


class TestMemberOutlier:
    def test_negative_rate_far_from_the_rest_of_the_group(self):
        flag = flags.member_outlier(MemberStats(total=6, negative=6),
                                    [MemberStats(10, 1), MemberStats(8, 1)])
        assert flag is not None and flag.code == flags.MEMBER_OUTLIER
        assert "negative rate 100%" in flag.detail

    def test_rate_within_the_difference_is_fine(self):
        assert flags.member_outlier(MemberStats(6, 3), [MemberStats(10, 2), MemberStats(8, 1)]) is None

    def test_too_few_samples_to_judge(self):
        assert flags.member_outlier(MemberStats(4, 4), [MemberStats(10, 0), MemberStats(8, 0)]) is None

    def test_the_rest_of_the_group_needs_enough_samples_for_a_rate(self):
        # The others have 2 samples together: too few for a rate; 3 samples is not more than 3× their median.
        assert flags.member_outlier(MemberStats(3, 0), [MemberStats(1, 1), MemberStats(1, 1)],
                                    min_samples=3) is None

    def test_volume_more_than_three_times_the_median(self):
        flag = flags.member_outlier(MemberStats(31, 3), [MemberStats(10, 1), MemberStats(9, 1),
                                                         MemberStats(11, 1)])
        assert flag is not None and "median of 10" in flag.detail

    def test_volume_at_three_times_the_median_is_fine(self):
        assert flags.member_outlier(MemberStats(30, 3), [MemberStats(10, 1), MemberStats(10, 1)]) is None

    def test_alone_in_the_window_nobody_to_compare_with(self):
        assert flags.member_outlier(MemberStats(50, 50), []) is None
        assert flags.member_outlier(MemberStats(50, 50), [MemberStats(0, 0)]) is None

    def test_thresholds_are_parameters(self):
        # 6 of 12 against 0 of 20: pooled rate 6/32, standard error sqrt(0.1523 (1/12 + 1/20)) = 0.1425,
        # so the 0.5 difference is z = 3.508.
        member, others = MemberStats(12, 6), [MemberStats(20, 0)]
        assert flags.rate_z(member, others[0]) == pytest.approx(3.508, abs=1e-3)
        assert flags.member_outlier(member, others) is not None  # 50% vs 0%
        assert flags.member_outlier(member, others, rate_diff=0.6) is None
        assert flags.member_outlier(member, others, z_min=4) is None

    def test_a_few_samples_apart_by_luck_are_not_an_outlier(self):
        # The all-honest group of the persona bench: 5 of 5 negative against 3 of 6 and 1 of 6. 0.5 and 0.83
        # apart, but against 3 of 6 that is z = 0.5 / sqrt(8/11 * 3/11 * (1/5 + 1/6)) = 1.854: luck.
        member, others = MemberStats(5, 5), [MemberStats(6, 3), MemberStats(6, 1)]
        assert flags.rate_z(member, others[0]) == pytest.approx(1.854, abs=1e-3)
        assert flags.member_outlier(member, others) is None

    def test_an_honest_member_next_to_another_honest_one_is_not_flagged_by_the_adversary(self):
        # One adversary among three: the honest member (9 of 10 negative) is 0.7 from the adversary (2 of 10)
        # but 0.1 from the other honest member (8 of 10): not an outlier. Pooled, the others' 50 % would have
        # flagged them. The adversary is far from both (z = 3.146 and 2.683).
        honest, other_honest, adversary = MemberStats(10, 9), MemberStats(10, 8), MemberStats(10, 2)
        assert flags.member_outlier(honest, [other_honest, adversary]) is None
        assert flags.rate_z(adversary, honest) == pytest.approx(3.146, abs=1e-3)
        assert flags.rate_z(adversary, other_honest) == pytest.approx(2.683, abs=1e-3)
        flag = flags.member_outlier(adversary, [honest, other_honest])
        assert flag is not None and "negative rate 20%" in flag.detail and "(80%, 90%)" in flag.detail

    def test_others_with_too_few_samples_are_left_out_of_the_rate(self):
        # One other member with 2 samples (too few for a rate), one far away with 10: compared with the latter
        flag = flags.member_outlier(MemberStats(10, 10), [MemberStats(2, 2), MemberStats(10, 1)])
        assert flag is not None and "(10%)" in flag.detail


class TestNearDuplicate:
    def test_normalise_folds_case_punctuation_and_spaces(self):
        assert flags.normalise_text("  Redo it!!  NOW.") == flags.normalise_text("redo it now")
        assert flags.normalise_text("redo_it, now") == "redo it now"

    @pytest.mark.parametrize(("previous", "threshold", "flagged"), [
        (0, 3, False), (1, 3, False), (2, 3, True), (7, 3, True), (0, 1, True), (1, 2, True), (0, 2, False),
    ])
    def test_the_nth_copy_is_flagged(self, previous, threshold, flagged):
        flag = flags.near_duplicate(previous=previous, threshold=threshold)
        assert (flag is not None) is flagged
        if flagged:
            assert flag.code == flags.NEAR_DUPLICATE and str(previous + 1) in flag.detail


class TestKeys:
    def test_new_key(self):
        flag = flags.new_key(key_created_at=T0 - timedelta(hours=2), at=T0, min_age=timedelta(hours=24))
        assert flag is not None and flag.code == flags.NEW_KEY and "2.0 h" in flag.detail

    def test_old_enough_key(self):
        day = timedelta(hours=24)
        assert flags.new_key(key_created_at=T0 - day, at=T0, min_age=day) is None
        assert flags.new_key(key_created_at=None, at=T0, min_age=timedelta(hours=24)) is None

    def test_revoked_key(self):
        flag = flags.revoked_key(key_revoked_at=T0 - timedelta(minutes=1), at=T0)
        assert flag is not None and flag.code == flags.REVOKED_KEY

    def test_revoked_after_judging_or_never(self):
        assert flags.revoked_key(key_revoked_at=T0 + timedelta(minutes=1), at=T0) is None
        assert flags.revoked_key(key_revoked_at=None, at=T0) is None


class TestSplitVotes:
    @pytest.mark.parametrize("votes", [[1, 1, 1], [-1, -1, -1], [1, None, 1], [None, None], [],
                                       [{"raw": "\\boxed{1}", "score": 1}] * 3])
    def test_unanimous_or_no_opinion(self, votes):
        assert flags.split_votes(votes) is None

    @pytest.mark.parametrize("votes", [[1, -1, 1], [1, 0, 1], [-1, 0, None],
                                       [{"raw": "a", "score": 1}, {"raw": "b", "score": -1}]])
    def test_disagreement(self, votes):
        flag = flags.split_votes(votes)
        assert flag is not None and flag.code == flags.SPLIT_VOTES

    def test_booleans_are_not_scores(self):
        assert flags.vote_scores([True, 1, False]) == [1]


class TestPolicy:
    @pytest.mark.parametrize(("mode", "flagged", "state"), [
        ("auto", False, "approved"), ("auto", True, "pending"),
        ("flagged", False, "approved"), ("flagged", True, "pending"),
        ("manual", False, "pending"), ("manual", True, "pending"),
    ])
    def test_initial_state(self, mode, flagged, state):
        found = [flags.Flag(flags.SPLIT_VOTES, "votes -1, +1")] if flagged else []
        assert flags.initial_state(mode, found) == state


@pytest.mark.parametrize(("limit", "share", "cap"), [(16, 0.5, 8), (5, 0.5, 3), (1, 0.5, 1), (10, 0.0, 1),
                                                     (10, 0.25, 3)])
def test_member_cap(limit, share, cap):
    assert flags.member_cap(limit, share) == cap
