"""What the consensus guard reads for a new group sample: each member's most recent judged samples, bounded.

The guard (``review.flags.consensus_of``) compares the new sample's author with the other members on the same
reply style. Reading the group's whole outlier window for every new sample would cost O(samples in the
window) per sample, so O(n^2) over a busy week. Instead each member contributes at most ``per_member`` of
their newest samples in the window: one indexed query per member (``sample_user_recent``), so the work per
sample is bounded by members x ``per_member`` whatever the group's volume.

Per member and not "the group's newest N": a member who floods the group would otherwise push the others'
samples out of the read, and an honest member would then be compared with the flooder alone. The consensus
is the mean over members of each member's mean, so a member's newest ``per_member`` samples are a fair
stand-in for their whole window; the author's own figure becomes their recent behaviour, which also means a
member who turns after a long honest history is judged on what they do now.
"""

from datetime import datetime

from clawhub.groups.models import Membership
from clawhub.review import flags as guards
from clawhub.review.models import Sample
from clawhub.tenants.models import Tenant

# Each member's newest samples the guard reads: far above its min_pairs (6), far below a busy week.
PER_MEMBER = 200


def judged_recent(*, tenant: Tenant, author_id: int, since: datetime,
                  per_member: int | None = None) -> list[guards.Judged]:
    """The judged, styled, not deleted samples since ``since`` of the group's members (and of the author, who
    may have just left), at most ``per_member`` (default ``PER_MEMBER``) newest of each."""
    per_member = PER_MEMBER if per_member is None else per_member
    members = set(Membership.objects.filter(group_id=tenant.group_id).values_list("user_id", flat=True))
    members.add(author_id)
    judged: list[guards.Judged] = []
    for user_id in sorted(members):
        rows = (Sample.objects.filter(user_id=user_id, tenant=tenant, created_at__gte=since)
                .exclude(reply_style="").exclude(state=Sample.State.DELETED)
                .order_by("-created_at", "-id").values_list("pk", "reward", "reply_style")[:per_member])
        judged += [guards.Judged(sample_id=pk, member_id=user_id, reward=reward, style=style)
                   for pk, reward, style in rows]
    return judged
