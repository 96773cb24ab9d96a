"""What the consensus guard reads for a new group sample: each member's most recent judged samples, bounded.

The guard (``review.flags.group_verdicts``) compares the group's members with each other on the same reply
style. Reading the group's whole outlier window for every new sample would cost O(samples in the
window) per sample, so O(n^2) over a busy week. Instead each member contributes at most ``per_member`` of
their newest samples in the window: one indexed query per member (``sample_user_recent``), so the work per
sample is bounded by members x ``per_member`` whatever the group's volume.

Per member and not "the group's newest N": a member who floods the group would otherwise push the others'
samples out of the read, and an honest member would then be compared with the flooder alone. Each other
member's lean on a style is their mean reward on it, so a member's newest ``per_member`` samples are a fair
stand-in for their whole window; the author's own figure becomes their recent behaviour, which also means a
member who turns after a long honest history is judged on what they do now.

The same read gives each member's standing for training (``member_standings``): a member the guard could
compare but has not yet waits on probation, so that the first batches cannot be steered before any flag.
"""

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from clawhub.groups.models import Membership
from clawhub.review import flags as guards
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.tenants.models import Tenant

# Each member's newest samples the guard reads: far above its min_pairs (6), far below a busy week.
PER_MEMBER = 200


def judged_recent(*, tenant: Tenant, author_id: int | None, since: datetime,
                  per_member: int | None = None) -> list[guards.Judged]:
    """The judged, styled, not deleted samples since ``since`` of the group's members (and of the author, who
    may have just left), at most ``per_member`` (default ``PER_MEMBER``) newest of each."""
    per_member = PER_MEMBER if per_member is None else per_member
    members = set(Membership.objects.filter(group_id=tenant.group_id).values_list("user_id", flat=True))
    if author_id is not None:
        members.add(author_id)
    judged: list[guards.Judged] = []
    for user_id in sorted(members):
        rows = (Sample.objects.filter(user_id=user_id, tenant=tenant, created_at__gte=since)
                .exclude(reply_style="").exclude(state=Sample.State.DELETED)
                .order_by("-created_at", "-id").values_list("pk", "reward", "reply_style")[:per_member])
        judged += [guards.Judged(sample_id=pk, member_id=user_id, reward=reward, style=style)
                   for pk, reward, style in rows]
    return judged


# A member still on probation trains once they have this many times the guard's min_pairs judged samples in
# the window: the guard has then been undecided about them for long, and holding their feedback longer would
# only starve the group (the influence cap still bounds what they carry).
PROBATION_FACTOR = 4

PROBATION = "probation"  # the guard's "undecided", while the member's samples wait


@dataclass(frozen=True)
class Standing:
    """Where a member stands with the consensus guard now: ``agrees``, ``disagrees`` (with the flag and its
    evidence), ``probation`` (the guard is undecided) or ``not_compared`` (fewer than two other members have
    a lean on any style of the member's replies, or probation ran out)."""

    state: str
    flag: guards.Flag | None = None


def member_standings(*, tenant: Tenant, policy: ReviewPolicy,
                     now: datetime | None = None) -> dict[int, Standing]:
    """Each member's standing over the policy's outlier window (the same bounded read as the guard).

    Why a probation: the guard flags a member once it is sure they disagree with most of the others, but a
    group's first batch fills before that (on the persona bench the adversary had 4 samples in the first
    batch of 16, which turned the group adapter's compliance from 0.46 to 0.0 before any flag could be
    raised, and later updates did not bring it back). So while the guard is undecided about a member, their
    samples wait (approved, not offered for training). A member whose replies no two others have a lean on
    is not compared at all (as in a group of two), so that one member with replies unlike everyone else's
    does not hold the rest of the group back.
    """
    since = (now or timezone.now()) - policy.outlier_window
    judged = judged_recent(tenant=tenant, author_id=None, since=since)
    verdicts = guards.group_verdicts(judged, threshold=policy.consensus_threshold,
                                     min_pairs=policy.consensus_min_pairs)
    samples: dict[int, int] = {}
    for j in judged:
        samples[j.member_id] = samples.get(j.member_id, 0) + 1
    standings = {}
    for member, verdict in verdicts.items():
        state = verdict.state
        if state == guards.UNDECIDED:
            state = PROBATION if samples.get(member, 0) < PROBATION_FACTOR * policy.consensus_min_pairs \
                else guards.NOT_COMPARED
        flag = guards.consensus_disagreement(verdict, threshold=policy.consensus_threshold,
                                             min_pairs=policy.consensus_min_pairs)
        standings[member] = Standing(state, flag)
    return standings
