"""The consensus guard: the statistic on hand-computed cases, and the guard in the sample pipeline."""

import pytest

from clawhub.review import flags
from clawhub.review.flags import Judged, consensus_disagreement, consensus_of, reply_style
from clawhub.review.models import Sample
from tests.factories import add_member, make_group, make_user
from tests.review.conftest import make_sample, old_key

BOLD, PLAIN = "bold+numbered|medium", "plain|medium"


def judged(member: int, style: str, *rewards: int) -> list[Judged]:
    return [Judged(sample_id=member * 100 + i, member_id=member, reward=r, style=style)
            for i, r in enumerate(rewards)]


def test_reply_style_is_markup_and_how_developed_the_reply_is():
    assert reply_style("**Step 1**: add them.\n1. 3 + 4\n2. = 7") == "bold+numbered|worked"
    assert reply_style("First add three and four, then you get seven.") == "plain|terse"
    assert reply_style("Add them. Then count. So it is 7.") == "plain|worked"
    assert reply_style("- a\n- b\n" + "More. " * 8) == "bullets|long"


def test_one_adversary_among_three():
    # Honest members 1 and 2 score bold replies -1 and plain ones +1 (member 1 with one noisy +1 on bold);
    # the adversary (3) scores bold +1 three times and -1 once, plain -1 twice.
    data = (judged(1, BOLD, -1, -1, +1) + judged(1, PLAIN, +1, +1) + judged(2, BOLD, -1, -1)
            + judged(2, PLAIN, +1, +1) + judged(3, BOLD, +1, +1, +1, -1) + judged(3, PLAIN, -1, -1))
    adversary = consensus_of(3, data)
    # Bold: the others' consensus is the mean of member means, (-1/3 + -1) / 2 = -2/3; plain: (+1 + +1) / 2.
    # All 6 of the adversary's samples are comparable; 5 disagree (the bold -1 agrees): rate 5/6.
    assert (adversary.comparable, adversary.disagreeing) == (6, 5)
    assert adversary.rate == pytest.approx(5 / 6)
    flag = consensus_disagreement(adversary, threshold=0.6, min_pairs=6)
    assert flag is not None and flag.code == flags.CONSENSUS
    assert "5 of 6" in flag.detail and "83%" in flag.detail
    pair = flag.evidence[0]
    assert pair["sample"] == 300 and pair["reward"] == 1 and pair["style"] == BOLD
    assert pair["group_consensus"] == pytest.approx(-0.67) and pair["other_members"] == 2
    assert pair["other_sample"] in (100, 101, 200, 201)  # an other member's -1 on a bold reply
    # An honest member's others are split one against one on each style (consensus 0): nothing to compare,
    # so one adversary cannot get an honest member flagged.
    honest = consensus_of(1, data)
    assert honest.comparable == 0 and consensus_disagreement(honest) is None


def test_two_adversaries_among_five():
    honest = [m for h in (1, 2, 3) for m in judged(h, BOLD, -1, -1) + judged(h, PLAIN, +1, +1)]
    adversaries = [m for a in (4, 5) for m in judged(a, BOLD, +1, +1, +1) + judged(a, PLAIN, -1, -1, -1)]
    data = honest + adversaries
    # For adversary 4 the others are 3 honest and 1 adversary: bold (-1 -1 -1 +1) / 4 = -0.5, plain +0.5.
    four = consensus_of(4, data)
    assert (four.comparable, four.disagreeing) == (6, 6) and four.rate == 1.0
    assert four.pairs[0]["group_consensus"] == pytest.approx(-0.5)
    assert consensus_disagreement(four) is not None and consensus_disagreement(consensus_of(5, data))
    # For an honest member the others are 2 honest and 2 adversaries: consensus 0 on both styles.
    for member in (1, 2, 3):
        assert consensus_of(member, data).comparable == 0
        assert consensus_disagreement(consensus_of(member, data)) is None


def test_no_adversary_noise_is_not_flagged():
    # Member 1 has one noisy +1 on bold, member 3 one noisy -1 on plain.
    data = (judged(1, BOLD, -1, -1, +1) + judged(1, PLAIN, +1, +1, +1) + judged(2, BOLD, -1, -1)
            + judged(2, PLAIN, +1, +1) + judged(3, BOLD, -1, -1) + judged(3, PLAIN, +1, -1))
    one = consensus_of(1, data)
    # Bold: others -1 and -1; plain: others +1 and (+1 - 1) / 2 = 0, mean 0.5 >= 0.34: comparable.
    assert (one.comparable, one.disagreeing) == (6, 1)
    assert consensus_disagreement(one) is None  # 1/6 = 17 %, under 60 %
    three = consensus_of(3, data)
    # Bold: (-1/3 + -1) / 2; plain: (+1 + +1) / 2; 4 comparable, 1 disagreeing, under min_pairs.
    assert (three.comparable, three.disagreeing) == (4, 1)
    assert consensus_disagreement(three) is None
    for member in (1, 2, 3):
        assert consensus_disagreement(consensus_of(member, data)) is None


def test_a_member_flooding_a_style_still_counts_once():
    # Two honest members score bold -1 once each; a third member floods bold with 10 times +1. For a fourth
    # member who scores bold -1, the consensus is the mean of member means, (-1 - 1 + 1) / 3 = -1/3: not a
    # clear lean, so the flooder cannot make the fourth member look like the one who disagrees.
    data = judged(1, BOLD, -1) + judged(2, BOLD, -1) + judged(3, BOLD, *[+1] * 10) + judged(4, BOLD, -1)
    assert consensus_of(4, data).comparable == 0
    assert consensus_of(3, data).disagreeing == 10  # and the flooder stays compared against both others


@pytest.fixture
def trio(db):
    owner = make_user()
    group = make_group(owner)
    members = [owner, add_member(group), add_member(group)]
    keys = [old_key(m, group=group) for m in members]
    return group, members, keys


BOLD_REPLY = "**Step 1**: add them.\n1. Add 3 and 4.\n2. That makes 7."
PLAIN_REPLY = "First you add 3 and 4, and then you get 7 in all."


def test_the_adversary_is_flagged_in_the_pipeline_and_their_approved_samples_wait(trio):
    group, (h1, h2, adversary), (k1, k2, ka) = trio
    for user, key in ((h1, k1), (h2, k2)):
        for _ in range(2):
            make_sample(user, key=key, reward=-1, reply=BOLD_REPLY)
            make_sample(user, key=key, reward=+1, reply=PLAIN_REPLY)
    made = []
    for i in range(6):
        reply, reward = (BOLD_REPLY, +1) if i % 2 == 0 else (PLAIN_REPLY, -1)
        made.append(make_sample(adversary, key=ka, reward=reward, reply=reply))
    # The first five go through (under the guard's 6 comparable replies); the sixth is flagged and pulls the
    # five approved ones back to review with the same flag and its evidence.
    assert all(s.state == Sample.State.APPROVED for s in made[:5])  # as each was created
    last = made[-1]
    assert flags.CONSENSUS in last.flag_codes and last.state == Sample.State.PENDING
    flag = next(f for f in last.flags if f["code"] == flags.CONSENSUS)
    assert "6 of 6" in flag["detail"]
    assert flag["evidence"] and flag["evidence"][0]["style"] == reply_style(BOLD_REPLY)
    states = set(Sample.objects.filter(user=adversary).values_list("state", flat=True))
    assert states == {Sample.State.PENDING}
    assert all(flags.CONSENSUS in s.flag_codes for s in Sample.objects.filter(user=adversary))
    # The honest members' samples are untouched and never flagged by it.
    honest = Sample.objects.filter(user__in=[h1, h2])
    assert all(flags.CONSENSUS not in s.flag_codes for s in honest)
    assert set(honest.values_list("state", flat=True)) == {Sample.State.APPROVED}
    # The statistic is over other members only: the next honest sample is not flagged either.
    assert flags.CONSENSUS not in make_sample(h1, key=k1, reward=-1, reply=BOLD_REPLY).flag_codes


def test_the_review_console_shows_the_reason_and_the_disagreeing_pairs(trio):
    from django.test import Client

    group, (h1, h2, adversary), (k1, k2, ka) = trio
    for user, key in ((h1, k1), (h2, k2)):
        make_sample(user, key=key, reward=-1, reply=BOLD_REPLY)
        make_sample(user, key=key, reward=+1, reply=PLAIN_REPLY)
    made = [make_sample(adversary, key=ka, reward=+1 if i % 2 == 0 else -1,
                        reply=BOLD_REPLY if i % 2 == 0 else PLAIN_REPLY) for i in range(6)]
    client = Client()
    client.force_login(h1)  # the group's owner reviews
    html = client.get(f"/review/{made[-1].pk}/").content.decode()
    assert "consensus_disagreement" in html and "rewarded 6 of 6 comparable replies" in html
    assert 'class="flag-evidence"' in html
    # The first disagreeing pair is the adversary's first sample, with an honest member's opposite score.
    assert f'href="/review/{made[0].pk}/"' in html
    assert "+1 on a <code>bold+numbered|worked</code> reply" in html
    assert "where the 2 other members score that style -1.00 on average" in html


def test_a_style_nobody_else_scored_is_compared_on_markup_or_not():
    # Others scored "bold+numbered|worked" and "bold|worked" -1; member 3's "numbered|worked" +1 has no exact
    # match, so it is compared on "marked|worked": member 1 mean -1, member 2 mean -1 -> consensus -1.
    data = (judged(1, "bold+numbered|worked", -1) + judged(2, "bold|worked", -1, -1)
            + judged(3, "numbered|worked", +1) + judged(3, "plain|terse", +1))
    three = consensus_of(3, data)
    assert (three.comparable, three.disagreeing) == (1, 1)  # plain|terse: nobody else scored it at all
    assert three.pairs[0]["style"] == "marked|worked" and three.pairs[0]["group_consensus"] == -1.0
    assert flags.coarse_style("plain|terse") == "plain|terse"


def test_the_guard_reads_each_members_newest_samples_only(trio, monkeypatch, django_assert_num_queries):
    from datetime import timedelta

    from django.utils import timezone

    from clawhub.review import consensus

    group, (h1, h2, flooder), (k1, k2, kf) = trio
    since = timezone.now() - timedelta(days=7)
    make_sample(h1, key=k1, reward=-1, reply=BOLD_REPLY)
    make_sample(h2, key=k2, reward=-1, reply=BOLD_REPLY)
    flood = [make_sample(flooder, key=kf, reward=+1, reply=BOLD_REPLY) for _ in range(5)]
    read = consensus.judged_recent(tenant=group.tenant, author_id=h1.pk, since=since, per_member=3)
    by_member = {}
    for j in read:
        by_member.setdefault(j.member_id, []).append(j.sample_id)
    # The flooder's newest 3 of 5; the others' one each is still read (a flood does not push them out).
    assert sorted(by_member[flooder.pk]) == sorted(s.pk for s in flood[-3:])
    assert len(by_member[h1.pk]) == len(by_member[h2.pk]) == 1
    # One query for the members and one per member, however many samples the group has.
    with django_assert_num_queries(4):
        consensus.judged_recent(tenant=group.tenant, author_id=h1.pk, since=since, per_member=3)
    for _ in range(10):
        make_sample(flooder, key=kf, reward=+1, reply=BOLD_REPLY)
    with django_assert_num_queries(4):
        again = consensus.judged_recent(tenant=group.tenant, author_id=h1.pk, since=since, per_member=3)
    assert len(again) == 5
    # The module's bound is what the pipeline uses.
    monkeypatch.setattr(consensus, "PER_MEMBER", 2)
    assert len(consensus.judged_recent(tenant=group.tenant, author_id=h1.pk, since=since)) == 4


def test_a_style_only_one_other_member_scored_is_not_a_consensus():
    # As the persona bench found it: the honest owner (1) scores bold -1 and plain +1; only the adversary (3)
    # has scored bold yet (+1), and only the honest member (2) plain, once with -1. Against single members
    # the owner "disagrees" on every reply; with at least two others nothing is comparable.
    data = (judged(1, BOLD, -1, -1, -1) + judged(1, PLAIN, +1, +1, +1) + judged(3, BOLD, +1, +1, +1)
            + judged(2, PLAIN, -1))
    assert consensus_of(1, data, min_others=1).disagreeing == 6
    assert consensus_disagreement(consensus_of(1, data, min_others=1)) is not None
    assert consensus_of(1, data).comparable == 0 and consensus_disagreement(consensus_of(1, data)) is None
    # Once both others have scored both styles (member 2: bold -1, plain -1 +1 +1; the adversary plain -1),
    # bold is a split, (-1 + 1) / 2 = 0, and plain (1/3 - 1) / 2 = -1/3 is under the 0.34 lean: no consensus.
    data += judged(2, BOLD, -1) + judged(2, PLAIN, +1, +1) + judged(3, PLAIN, -1)
    assert consensus_of(1, data).comparable == 0
    # ... while the adversary, against the two honest members (bold -1 and -1; plain +1 and +1/3), is compared
    # on everything and disagrees on everything.
    assert consensus_of(3, data).comparable == 4 and consensus_of(3, data).disagreeing == 4
