"""The consensus guard: the statistic on hand-computed cases, and the guard in the sample pipeline."""

import pytest

from clawhub.review import flags
from clawhub.review.flags import (
    Judged,
    consensus_disagreement,
    consensus_of,
    group_verdicts,
    reply_style,
    wilson_interval,
)
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


def rates(consensus) -> dict[int, tuple[int, int]]:
    """One way: (comparable, disagreeing) of a member's replies against each other member's lean."""
    return {a.other_id: (a.comparable, a.disagreeing) for a in consensus.against}


def pairs(verdict) -> dict[int, tuple[int, int, str]]:
    """Both ways: (comparable, disagreeing, verdict) with each other member."""
    return {p.other_id: (p.comparable, p.disagreeing, p.verdict) for p in verdict.pairs}


def test_the_wilson_interval_on_hand_computed_cases():
    # 2 of 14 at z = 1.64: centre (2/14 + z^2/28) / (1 + z^2/14) = 0.2005, half-width 0.1518.
    assert wilson_interval(2, 14) == pytest.approx((0.0486, 0.3522), abs=1e-4)
    assert wilson_interval(12, 14) == pytest.approx((0.6478, 0.9514), abs=1e-4)  # the mirror image
    assert wilson_interval(0, 6) == pytest.approx((0.0, 0.3095), abs=1e-4)
    assert wilson_interval(7, 14) == pytest.approx((0.2993, 0.7007), abs=1e-4)  # even: undecided


def test_one_adversary_among_three():
    # Honest 1: bold -1 -1 -1 and one noisy +1 (lean -0.5), plain +1 x3. Honest 2: bold -1 x3, plain +1 +1 +1
    # and one noisy -1 (lean +0.5). The adversary (3): bold +1 +1 +1 -1 (lean +0.5), plain -1 x3.
    data = (judged(1, BOLD, -1, -1, -1, +1) + judged(1, PLAIN, +1, +1, +1) + judged(2, BOLD, -1, -1, -1)
            + judged(2, PLAIN, +1, +1, +1, -1) + judged(3, BOLD, +1, +1, +1, -1)
            + judged(3, PLAIN, -1, -1, -1))
    # One way, against each honest member's lean, 6 of the adversary's 7 replies disagree (the bold -1
    # agrees); each honest member's replies against the other's lean: 1 of 7 (its own noisy reaction).
    assert rates(consensus_of(3, data)) == {1: (7, 6), 2: (7, 6)}
    assert rates(consensus_of(1, data)) == {2: (7, 1), 3: (7, 6)}
    assert rates(consensus_of(2, data)) == {1: (7, 1), 3: (7, 6)}
    # Both ways: 12 of 14 with the adversary (Wilson [0.65, 0.95]: above 0.5, disagree), 2 of 14 between
    # the honest members ([0.05, 0.35]: agree).
    verdicts = group_verdicts(data)
    assert pairs(verdicts[3]) == {1: (14, 12, "disagree"), 2: (14, 12, "disagree")}
    assert pairs(verdicts[1]) == {2: (14, 2, "agree"), 3: (14, 12, "disagree")}
    assert {m: v.state for m, v in verdicts.items()} == {1: "agrees", 2: "agrees", 3: "disagrees"}
    flag = consensus_disagreement(verdicts[3])
    assert flag is not None and flag.code == flags.CONSENSUS
    assert "against 2 of the 2 other members" in flag.detail and "12 of 14 (86%)" in flag.detail
    pair = flag.evidence[0]
    assert pair["sample"] == 300 and pair["reward"] == 1 and pair["style"] == BOLD
    assert pair["other_member"] == 1 and pair["other_mean"] == pytest.approx(-0.5)
    assert pair["other_sample"] in (100, 101, 102)  # one of member 1's -1 on a bold reply
    assert len(flag.evidence) == 6  # up to 3 pairs against each of the two
    assert consensus_disagreement(verdicts[1]) is None


def test_two_adversaries_among_five():
    honest = [m for h in (1, 2, 3) for m in judged(h, BOLD, -1, -1, -1) + judged(h, PLAIN, +1, +1, +1)]
    adversaries = [m for a in (4, 5) for m in judged(a, BOLD, +1, +1, +1) + judged(a, PLAIN, -1, -1, -1)]
    verdicts = group_verdicts(honest + adversaries)
    # Adversary 4 disagrees with each honest member on all 12 replies compared both ways and agrees with
    # the other adversary: 3 of 4 others, a majority.
    assert pairs(verdicts[4]) == {1: (12, 12, "disagree"), 2: (12, 12, "disagree"), 3: (12, 12, "disagree"),
                                  5: (12, 0, "agree")}
    assert "against 3 of the 4 other members" in consensus_disagreement(verdicts[4]).detail
    # An honest member disagrees with the two adversaries only (2 of 4 is not more than half), and agrees
    # with the two honest members, who outnumber the unflagged others it does not agree with (none).
    assert {m: v.state for m, v in verdicts.items()} == {1: "agrees", 2: "agrees", 3: "agrees",
                                                         4: "disagrees", 5: "disagrees"}


def test_no_adversary_noise_is_not_flagged():
    # Each honest member has one noisy reaction: 1 a bold +1, 2 a plain -1, 3 a bold +1.
    data = (judged(1, BOLD, -1, -1, -1, +1) + judged(1, PLAIN, +1, +1, +1)
            + judged(2, BOLD, -1, -1, -1) + judged(2, PLAIN, +1, +1, +1, -1)
            + judged(3, BOLD, -1, -1, +1, -1) + judged(3, PLAIN, +1, +1, +1))
    # One way, each member's noisy reaction is the one disagreeing reply of 7; both ways 2 of 14: agree.
    assert rates(consensus_of(1, data)) == {2: (7, 1), 3: (7, 1)}
    assert rates(consensus_of(2, data)) == {1: (7, 1), 3: (7, 1)}
    assert rates(consensus_of(3, data)) == {1: (7, 1), 2: (7, 1)}
    verdicts = group_verdicts(data)
    assert all(p.verdict == "agree" and (p.comparable, p.disagreeing) == (14, 2)
               for v in verdicts.values() for p in v.pairs)
    assert {v.state for v in verdicts.values()} == {"agrees"}


def test_the_guard_stays_undecided_when_the_group_cannot_tell_who_is_odd():
    # Members 1 and 2 disagree on every bold reply (12 of 12 both ways), and each agrees with member 3 on
    # another style (6 of 6 both ways, no disagreement): nothing says whether 1 or 2 is the odd one out.
    data = (judged(1, BOLD, *[-1] * 6) + judged(1, PLAIN, +1, +1, +1) + judged(2, BOLD, *[+1] * 6)
            + judged(2, "plain|long", +1, +1, +1) + judged(3, PLAIN, +1, +1, +1)
            + judged(3, "plain|long", +1, +1, +1))
    verdicts = group_verdicts(data)
    assert pairs(verdicts[1]) == {2: (12, 12, "disagree"), 3: (6, 0, "agree")}
    assert {m: v.state for m, v in verdicts.items()} == {1: "undecided", 2: "undecided", 3: "agrees"}
    assert consensus_disagreement(verdicts[1]) is None


def test_a_lean_needs_two_samples_and_a_clear_mean():
    # Member 2 scored bold once (-1): one reaction is not a lean. Member 3 scored bold -1 -1 +1: a mean of
    # -1/3 is under the 0.34 lean. Member 4 bold -1 -1: a lean.
    data = (judged(1, BOLD, +1, +1) + judged(2, BOLD, -1) + judged(3, BOLD, -1, -1, +1)
            + judged(4, BOLD, -1, -1))
    assert rates(consensus_of(1, data)) == {4: (2, 2)}


def test_a_member_flooding_a_style_still_counts_once():
    # Two honest members score bold -1 twice each; a third member floods bold with 10 times +1; a fourth
    # scores bold -1 six times. The flooder disagrees with all three (12 to 16 replies each, all of them);
    # the fourth disagrees with the flooder only, one of three, and agrees with the other two.
    data = (judged(1, BOLD, -1, -1) + judged(2, BOLD, -1, -1) + judged(3, BOLD, *[+1] * 10)
            + judged(4, BOLD, *[-1] * 6))
    verdicts = group_verdicts(data)
    assert pairs(verdicts[3]) == {1: (12, 12, "disagree"), 2: (12, 12, "disagree"), 4: (16, 16, "disagree")}
    assert pairs(verdicts[4]) == {1: (8, 0, "agree"), 2: (8, 0, "agree"), 3: (16, 16, "disagree")}
    assert verdicts[3].state == "disagrees" and verdicts[4].state == "agrees"
    # Members 1 and 2 have compared over 4 replies only (undecided), so 1 agrees with 4 and waits on 2.
    assert verdicts[1].state == "undecided"


def test_a_group_of_two_is_never_judged():
    data = judged(1, BOLD, *[-1] * 8) + judged(2, BOLD, *[+1] * 8)
    verdicts = group_verdicts(data)
    assert pairs(verdicts[1]) == {2: (16, 16, "disagree")}
    assert {v.state for v in verdicts.values()} == {"not_compared"}
    assert consensus_disagreement(verdicts[1]) is None


@pytest.fixture
def trio(db):
    owner = make_user()
    group = make_group(owner)
    members = [owner, add_member(group), add_member(group)]
    keys = [old_key(m, group=group) for m in members]
    return group, members, keys


BOLD_REPLY = "**Step 1**: add them.\n1. Add 3 and 4.\n2. That makes 7."
PLAIN_REPLY = "First you add 3 and 4, and then you get 7 in all."


def honest_members_score(trio) -> None:
    """The two honest members each mark the bold reply down and the plain one up, twice."""
    _, (h1, h2, _), (k1, k2, _) = trio
    for user, key in ((h1, k1), (h2, k2)):
        for _ in range(2):
            make_sample(user, key=key, reward=-1, reply=BOLD_REPLY)
            make_sample(user, key=key, reward=+1, reply=PLAIN_REPLY)


def test_the_adversary_is_flagged_in_the_pipeline_and_their_approved_samples_wait(trio):
    group, (h1, h2, adversary), (k1, k2, ka) = trio
    honest_members_score(trio)
    made = []
    for i in range(4):
        reply, reward = (BOLD_REPLY, +1) if i % 2 == 0 else (PLAIN_REPLY, -1)
        made.append(make_sample(adversary, key=ka, reward=reward, reply=reply))
    # The first three go through (5 replies compared both ways with each honest member at the third: under
    # min_pairs); the fourth, 8 of 8 with each, is flagged and pulls the three approved ones back to review
    # with the same flag and its evidence.
    assert all(s.state == Sample.State.APPROVED for s in made[:3])  # as each was created
    last = made[-1]
    assert flags.CONSENSUS in last.flag_codes and last.state == Sample.State.PENDING
    flag = next(f for f in last.flags if f["code"] == flags.CONSENSUS)
    assert "8 of 8 (100%), 8 of 8 (100%)" in flag["detail"]
    assert flag["evidence"] and flag["evidence"][0]["style"] == reply_style(BOLD_REPLY)
    states = set(Sample.objects.filter(user=adversary).values_list("state", flat=True))
    assert states == {Sample.State.PENDING}
    assert all(flags.CONSENSUS in s.flag_codes for s in Sample.objects.filter(user=adversary))
    # The honest members' samples are untouched and never flagged by it.
    honest = Sample.objects.filter(user__in=[h1, h2])
    assert all(flags.CONSENSUS not in s.flag_codes for s in honest)
    assert set(honest.values_list("state", flat=True)) == {Sample.State.APPROVED}
    # The next honest sample is not flagged either: its author disagrees with the adversary only.
    assert flags.CONSENSUS not in make_sample(h1, key=k1, reward=-1, reply=BOLD_REPLY).flag_codes


def test_the_review_console_shows_the_reason_and_the_disagreeing_pairs(trio):
    from django.test import Client

    group, (h1, h2, adversary), (k1, k2, ka) = trio
    honest_members_score(trio)
    made = [make_sample(adversary, key=ka, reward=+1 if i % 2 == 0 else -1,
                        reply=BOLD_REPLY if i % 2 == 0 else PLAIN_REPLY) for i in range(6)]
    client = Client()
    client.force_login(h1)  # the group's owner reviews
    html = client.get(f"/review/{made[-1].pk}/").content.decode()
    assert "consensus_disagreement" in html and "against 2 of the 2 other members" in html
    assert 'class="flag-evidence"' in html
    # The pairs are the newest first: the adversary's previous sample, with an honest member's opposite score.
    assert f'href="/review/{made[-2].pk}/"' in html
    assert "+1 on a <code>bold+numbered|worked</code> reply" in html
    assert "where another member scores that style -1.00 on average" in html


def test_a_style_nobody_else_scored_is_compared_on_markup_or_not():
    # Member 1 scored "bold+numbered|worked" -1 twice, member 2 "bold|worked" -1 twice; member 3's
    # "numbered|worked" +1 has no exact match with either, so it is compared on "marked|worked" (each
    # other's lean -1 there). Its "plain|terse" +1: nobody else scored it at all.
    data = (judged(1, "bold+numbered|worked", -1, -1) + judged(2, "bold|worked", -1, -1)
            + judged(3, "numbered|worked", +1) + judged(3, "plain|terse", +1))
    three = consensus_of(3, data)
    assert rates(three) == {1: (1, 1), 2: (1, 1)}
    pair = three.against[0].pairs[0]
    assert pair["style"] == "marked|worked" and pair["other_mean"] == -1.0 and pair["other_sample"] == 100
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


def test_the_bench_case_an_honest_owner_is_not_flagged_for_disagreeing_with_the_adversary():
    # As the persona bench found it with the pooled consensus: the honest owner (1) scores bold -1 and plain
    # +1; only the adversary (3) has scored bold yet (+1 x3), and the honest admin (2) plain twice with -1
    # (noise, or a plain reply that skipped steps). Pooled over "the others", the owner disagreed with the
    # group on every reply. Pair by pair: 6 of 6 with the adversary (disagree), 5 of 5 with the admin (too
    # few to decide): the owner is not flagged, only undecided.
    data = (judged(1, BOLD, -1, -1, -1) + judged(1, PLAIN, +1, +1, +1) + judged(3, BOLD, +1, +1, +1)
            + judged(2, PLAIN, -1, -1))
    verdicts = group_verdicts(data)
    assert pairs(verdicts[1]) == {2: (5, 5, "undecided"), 3: (6, 6, "disagree")}
    assert verdicts[1].state == "undecided" and consensus_disagreement(verdicts[1]) is None
    # Later the admin scores bold -1 -1 and plain +1 x4 (plain now +1/3: not a lean), the adversary plain
    # -1 -1. Owner and admin: 3 of 3 one way, 2 of 8 the other, 2 of 11 (Wilson [0.06, 0.43]): agree. The
    # adversary: 11 of 11 with the owner, 9 of 11 with the admin ([0.57, 0.94]): disagrees with both.
    data += judged(2, BOLD, -1, -1) + judged(2, PLAIN, +1, +1, +1, +1) + judged(3, PLAIN, -1, -1)
    verdicts = group_verdicts(data)
    assert pairs(verdicts[1]) == {2: (11, 2, "agree"), 3: (11, 11, "disagree")}
    assert pairs(verdicts[3]) == {1: (11, 11, "disagree"), 2: (11, 9, "disagree")}
    assert {m: v.state for m, v in verdicts.items()} == {1: "agrees", 2: "agrees", 3: "disagrees"}
