"""The consensus guard before training: members on probation wait, and a run's claim holds a member the guard
now finds disagreeing."""

import pytest
from django.test import Client

from clawhub.review import consensus, flags
from clawhub.review.models import Sample
from clawhub.review.selectors import review_policy_for, samples_for_training, trainable_count
from clawhub.review.services import sample_approve
from clawhub.tenants.access import review_access
from clawhub.training import services
from clawhub.training.models import TrainingRun
from tests.adapters.conftest import make_version
from tests.factories import add_member, make_group, make_user
from tests.review.conftest import make_sample, old_key

BOLD_REPLY = "**Step 1**: add them.\n1. Add 3 and 4.\n2. That makes 7."  # bold+numbered|worked
PLAIN_REPLY = "First you add 3 and 4, and then you get 7 in all."  # plain|terse
HEADING_REPLY = "## Sum\nSeven"  # heading|terse: a style nobody else's replies have


@pytest.fixture
def trio(db, settings):
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 8
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 0
    owner = make_user()
    group = make_group(owner)
    members = [owner, add_member(group), add_member(group)]
    keys = {m.pk: old_key(m, group=group) for m in members}
    return group, members, keys


def post(user, keys, *pairs: tuple[str, int], times: int = 1) -> list[Sample]:
    return [make_sample(user, key=keys[user.pk], reward=reward, reply=reply)
            for _ in range(times) for reply, reward in pairs]


def standings(group) -> dict[int, str]:
    policy = review_policy_for(tenant=group.tenant)
    return {m: s.state for m, s in consensus.member_standings(tenant=group.tenant, policy=policy).items()}


def test_members_wait_on_probation_until_the_guard_has_compared_them(trio):
    group, (h1, h2, adversary), keys = trio
    for honest in (h1, h2):
        post(honest, keys, (BOLD_REPLY, -1), (PLAIN_REPLY, +1), times=3)
    # Two members only: nobody can be judged, both train as before.
    assert standings(group) == {h1.pk: "not_compared", h2.pk: "not_compared"}
    assert trainable_count(tenant=group.tenant) == 12
    run = services.run_start(tenant=group.tenant)  # 8 of the 12
    version = make_version(group.tenant, 1, state="active")
    TrainingRun.objects.filter(pk=run.pk).update(state=TrainingRun.State.SUCCEEDED, adapter_version=version)
    # A third member's first two samples: compared both ways over 2 replies with each honest member, too
    # few to decide. The honest members agree with each other, but the one they agree with does not
    # outnumber the one the guard is undecided about: all three wait.
    post(adversary, keys, (BOLD_REPLY, +1), (PLAIN_REPLY, -1))
    assert set(standings(group).values()) == {"probation"}
    assert trainable_count(tenant=group.tenant) == 0
    assert samples_for_training(tenant=group.tenant) == []
    # The group page tells its managers why nothing trains.
    client = Client()
    client.force_login(h1)
    section = client.get(f"/groups/{group.slug}/").content.decode().split('id="influence"')[1]
    assert section.count("on probation: waits to be compared") == 3
    # Two more: 10 of 10 replies against each honest member both ways; flagged as its fourth sample is made,
    # so none of its samples was ever offered for training, and the honest members train again.
    post(adversary, keys, (BOLD_REPLY, +1), (PLAIN_REPLY, -1))
    assert standings(group) == {h1.pk: "agrees", h2.pk: "agrees", adversary.pk: "disagrees"}
    assert set(Sample.objects.filter(user=adversary).values_list("state", flat=True)) == {"pending"}
    assert trainable_count(tenant=group.tenant) == 12 - 8
    section = client.get(f"/groups/{group.slug}/").content.decode().split('id="influence"')[1]
    assert section.count(">agrees<") == 2 and section.count(">disagrees<") == 1


def test_a_member_no_two_others_can_be_compared_with_is_not_held_back(trio):
    group, (h1, h2, third), keys = trio
    for honest in (h1, h2):
        post(honest, keys, (BOLD_REPLY, -1), (PLAIN_REPLY, +1), times=3)
    # The third member's replies all have a style neither other member's have: never comparable, so not on
    # probation (and the honest members, whom only each other can be compared with, are not either).
    post(third, keys, (HEADING_REPLY, +1), (HEADING_REPLY, -1), times=3)
    assert standings(group) == {h1.pk: "not_compared", h2.pk: "not_compared", third.pk: "not_compared"}
    assert trainable_count(tenant=group.tenant) == 18


def test_probation_ends_after_a_bounded_number_of_samples(trio, monkeypatch):
    group, (h1, h2, third), keys = trio
    monkeypatch.setattr(consensus, "PROBATION_FACTOR", 2)  # 2 x min_pairs (6) = 12 samples
    for honest in (h1, h2):
        post(honest, keys, (BOLD_REPLY, -1), times=12)
    # The third member's one bold reply meets both others' lean, its heading replies nobody's: compared
    # over one reply with each, the guard stays undecided, and the member waits until 12 samples.
    post(third, keys, (BOLD_REPLY, +1))
    post(third, keys, (HEADING_REPLY, -1), times=10)
    assert standings(group)[third.pk] == "probation"
    post(third, keys, (HEADING_REPLY, -1))
    assert standings(group)[third.pk] == "not_compared"
    assert trainable_count(tenant=group.tenant) == 36


def test_the_claim_holds_a_member_the_others_samples_outvoted_since(trio):
    group, (h1, h2, adversary), keys = trio
    # The adversary's samples come while the others have one sample of each style (no lean yet): none is
    # flagged as it is made.
    for honest in (h1, h2):
        post(honest, keys, (BOLD_REPLY, -1), (PLAIN_REPLY, +1))
    made = post(adversary, keys, (BOLD_REPLY, +1), (PLAIN_REPLY, -1), times=3)
    assert all(s.state == "approved" and flags.CONSENSUS not in s.flag_codes for s in made)
    # A reviewer had approved one for another reason (say, a new key's flag).
    Sample.objects.filter(pk=made[0].pk).update(decided_by=h1, reason="new key, fine")
    # The honest members' later samples give them leans the adversary's 6 samples go against.
    for honest in (h1, h2):
        post(honest, keys, (BOLD_REPLY, -1), (PLAIN_REPLY, +1), times=2)
    assert standings(group)[adversary.pk] == "disagrees"
    assert set(Sample.objects.filter(user=adversary).values_list("state", flat=True)) == {"approved"}
    # Still approved, but not offered: the trainable count is the honest members' 12.
    assert trainable_count(tenant=group.tenant) == 12
    run = services.run_start(tenant=group.tenant)
    assert {s.user_id for s in Sample.objects.filter(pk__in=run.sample_ids)} == {h1.pk, h2.pk}
    held = Sample.objects.filter(user=adversary)
    assert set(held.values_list("state", flat=True)) == {"pending"}
    assert all(flags.CONSENSUS in s.flag_codes for s in held)
    first = held.get(pk=made[0].pk)
    assert first.decided_by is None and first.reason == ""  # the earlier decision no longer stands
    # A reviewer who approves one with the flag in view decides: it trains, and no later claim holds it.
    approved = sample_approve(access=review_access(actor=h1, tenant=group.tenant), sample_id=made[1].pk)
    assert approved.state == "approved"
    assert trainable_count(tenant=group.tenant) == 4 + 1  # the honest members' last 4, and this one
    assert made[1].pk in {s.pk for s in samples_for_training(tenant=group.tenant)}
