"""Finding 8: the poisoning guards cannot be walked around by the people they guard against.

A group admin whose own feedback the guards flagged may not approve it (another admin or staff decides), and
rollback goes only to versions that passed the gate (retired ones, or a held candidate), never to one the
gate rejected.
"""

import pytest

from clawhub.accounts.models import AuditLog
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.services import adapter_rollback
from clawhub.core.exceptions import Conflict
from clawhub.feedback.models import ExplicitFeedback
from clawhub.groups.models import Role
from clawhub.groups.services import membership_change_role, membership_leave, membership_remove
from clawhub.review.models import Sample
from clawhub.tenants.access import tenant_access
from tests.factories import add_member, make_group, make_user
from tests.review.conftest import ApiAs, make_sample, make_turn, old_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def crew():
    owner = make_user()
    group = make_group(owner)
    admin = add_member(group, make_user(), Role.ADMIN)
    key = old_key(admin, group=group)
    flagged = make_sample(admin, key=key, reward=-1, votes=[-1, -1, 1], next_text="That's wrong, redo it.")
    assert flagged.state == Sample.State.PENDING
    return owner, group, admin, flagged


def test_an_admin_cannot_approve_their_own_flagged_sample(crew):
    owner, _group, admin, flagged = crew
    response = ApiAs(admin).post(f"/api/review/samples/{flagged.pk}/approve/")
    assert response.status_code == 403 and response.json()["error"]["code"] == "self_approval"
    bulk = ApiAs(admin).post("/api/review/samples/bulk/", {"ids": [flagged.pk], "action": "approve"})
    assert bulk.status_code == 403
    flagged.refresh_from_db()
    assert flagged.state == Sample.State.PENDING and flagged.decided_by is None
    # Another admin (here the owner) decides, and that decision is audited.
    assert ApiAs(owner).post(f"/api/review/samples/{flagged.pk}/approve/").status_code == 200
    flagged.refresh_from_db()
    assert flagged.state == Sample.State.APPROVED and flagged.decided_by == owner
    assert AuditLog.objects.filter(action="sample.approve", actor=owner, target_id=str(flagged.pk)).exists()


def test_rejecting_ones_own_sample_is_fine(crew):
    _owner, _group, admin, flagged = crew
    response = ApiAs(admin).post(f"/api/review/samples/{flagged.pk}/reject/", {"reason": "my mistake"})
    assert response.status_code == 200


def test_rollback_to_a_version_the_gate_rejected_is_refused(crew, sent):
    owner, group, _admin, _flagged = crew
    tenant = group.tenant
    retired = AdapterVersion.objects.create(tenant=tenant, version=1, state="retired", artifact_path="/a/1")
    AdapterVersion.objects.create(tenant=tenant, version=2, state="active", artifact_path="/a/2")
    poisoned = AdapterVersion.objects.create(tenant=tenant, version=3, state="rejected", artifact_path="/a/3",
                                             decision="reject")
    ungated = AdapterVersion.objects.create(tenant=tenant, version=4, state="candidate", artifact_path="/a/4")
    response = ApiAs(owner).post(f"/api/adapters/versions/{poisoned.pk}/rollback/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "adapter_not_rollbackable"
    access = tenant_access(actor=owner, tenant_id=tenant.pk)
    with pytest.raises(Conflict):
        adapter_rollback(access=access, version=ungated)  # never through the gate
    assert sent.named("clawhub.train.promote") == []
    assert not AuditLog.objects.filter(action="adapter.rollback_requested").exists()
    # A version that was active before is still a valid rollback, audited.
    assert ApiAs(owner).post(f"/api/adapters/versions/{retired.pk}/rollback/").status_code == 202
    assert AuditLog.objects.filter(action="adapter.rollback_requested", target_id=str(retired.pk)).exists()


@pytest.mark.parametrize("how", ["removed", "left", "made_viewer"])
def test_someone_no_longer_a_member_cannot_rate_their_old_group_turns(how):
    """Finding N7: a member removed from a group rated an old group turn with a demonstration, which made a
    hinted group sample. Rating one's own turn of a group needs what steering the group's adapter needs: being
    a member or above now."""
    owner = make_user()
    group = make_group(owner)
    member = add_member(group, make_user(), Role.MEMBER)
    turn = make_turn(member, key=old_key(member, group=group))
    personal = make_turn(member)
    url = f"/api/turns/{turn.pk}/feedback/"
    demonstration = {"thumb": "down", "demonstration": "The reply the group's adapter should learn."}
    if how == "removed":
        membership_remove(actor=owner, group=group, user=member)
    elif how == "left":
        membership_leave(actor=member, group=group)
    else:
        membership_change_role(actor=owner, group=group, user=member, role=Role.VIEWER)
    api = ApiAs(member)
    assert api.post(url, demonstration).status_code == 404
    assert api.post(f"/conversations/turns/{turn.pk}/feedback/", demonstration).status_code == 404
    assert not ExplicitFeedback.objects.filter(turn=turn).exists()
    assert not Sample.objects.filter(turn=turn).exists()
    # Their personal turns are still theirs to rate, and the group's admins still rate the group's turn.
    assert api.post(f"/api/turns/{personal.pk}/feedback/", {"thumb": "up"}).status_code == 201
    assert ApiAs(owner).post(url, {"thumb": "up"}).status_code == 201
