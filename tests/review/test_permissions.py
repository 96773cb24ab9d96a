"""Who may do what in review: every action × (staff, group owner, group admin, member, viewer, other user).

The sample belongs to another member ("author") of the group. Members and viewers know the group exists, so
they get 403; anyone else gets 404, so the group's samples do not leak.
"""

import pytest

from clawhub.accounts.models import AuditLog
from clawhub.review.models import Sample
from tests.review.conftest import make_sample

pytestmark = pytest.mark.django_db

ROLES = ["staff", "owner", "admin", "member", "viewer", "other"]

# action -> expected status per role, written out.
EXPECTED = {
    "list_tenant": {"staff": 200, "owner": 200, "admin": 200, "member": 403, "viewer": 403, "other": 404},
    "detail": {"staff": 200, "owner": 200, "admin": 200, "member": 403, "viewer": 403, "other": 404},
    "approve": {"staff": 200, "owner": 200, "admin": 200, "member": 403, "viewer": 403, "other": 404},
    "reject": {"staff": 200, "owner": 200, "admin": 200, "member": 403, "viewer": 403, "other": 404},
    "bulk": {"staff": 200, "owner": 200, "admin": 200, "member": 403, "viewer": 403, "other": 404},
}
# The unfiltered list answers everyone (it lists what they review: at least their personal tenant's samples);
# only staff and the group's owner and admins see the group's sample in it.
SEES_IN_LIST = {"staff": True, "owner": True, "admin": True, "member": False, "viewer": False, "other": False}
DECISIONS = {"approve": Sample.State.APPROVED, "reject": Sample.State.REJECTED, "bulk": Sample.State.REJECTED}


def call(api, action: str, sample: Sample):
    base = "/api/review/samples/"
    if action == "list_tenant":
        return api.get(base, tenant=sample.tenant_id)
    if action == "detail":
        return api.get(f"{base}{sample.pk}/")
    if action == "approve":
        return api.post(f"{base}{sample.pk}/approve/", {"reason": "looks honest"})
    if action == "reject":
        return api.post(f"{base}{sample.pk}/reject/", {"reason": "spam"})
    return api.post(f"{base}bulk/", {"ids": [sample.pk], "action": "reject", "reason": "spam"})


@pytest.mark.parametrize("role", ROLES)
def test_list(team, pending_sample, api_as, role):
    response = api_as(team[role]).get("/api/review/samples/")  # no state: every state
    assert response.status_code == 200
    ids = [row["id"] for row in response.json()["results"]]
    assert (pending_sample.pk in ids) is SEES_IN_LIST[role]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", list(EXPECTED))
def test_matrix(team, pending_sample, api_as, action, role):
    response = call(api_as(team[role]), action, pending_sample)
    expected = EXPECTED[action][role]
    assert response.status_code == expected, response.content
    pending_sample.refresh_from_db()
    decisions = AuditLog.objects.filter(action__startswith="sample.", target_id=str(pending_sample.pk))
    if action in DECISIONS:
        if expected == 200:
            assert pending_sample.state == DECISIONS[action]
            assert pending_sample.decided_by == team[role]
            row = decisions.get()
            assert (row.actor, row.group, row.subject_user) == (team[role], team["group"], team["author"])
        else:
            assert pending_sample.state == Sample.State.PENDING and pending_sample.decided_by is None
            assert not decisions.exists()
            assert response.json()["error"]["code"] in ("permission_denied", "not_found")
    if action == "detail" and expected == 200:
        body = response.json()
        assert body["next_state"] == [{"role": "user", "content": "That's wrong, redo it."}]
        assert body["votes"] == [-1, -1, 1] and body["flags"][0]["code"] == "split_votes"


def test_the_author_may_not_approve_their_own_group_sample(team, pending_sample, api_as):
    assert call(api_as(team["author"]), "approve", pending_sample).status_code == 403
    pending_sample.refresh_from_db()
    assert pending_sample.state == Sample.State.PENDING


def test_everyone_reviews_their_own_personal_samples(team, api_as):
    from tests.review.conftest import old_key

    other = team["other"]
    sample = make_sample(other, key=old_key(other), reward=1, votes=[1, -1, 1])
    assert sample.state == Sample.State.PENDING
    api = api_as(other)
    assert api.post(f"/api/review/samples/{sample.pk}/approve/").status_code == 200
    # ...and nobody else's: the group owner has no business with it.
    assert call(api_as(team["owner"]), "approve", sample).status_code == 404


def test_anonymous_gets_401_or_403(pending_sample, api_client):
    assert api_client.get("/api/review/samples/").status_code in (401, 403)
    assert api_client.get("/api/me/samples/").status_code in (401, 403)
