"""The review console's REST API beyond permissions: filters, reasons, bulk, state rules, review modes."""

import pytest
from django.utils import timezone

from clawhub.accounts.models import AuditLog
from clawhub.review.models import ReviewPolicy, Sample
from tests.factories import make_run
from tests.review.conftest import make_sample

pytestmark = pytest.mark.django_db


@pytest.fixture
def mixed(team):
    """Group samples: one clean (+1, approved), one split (+1, pending), one negative split (pending)."""
    author, key = team["author"], team["author_key"]
    return {
        "clean": make_sample(author, key=key, reward=1),
        "split": make_sample(author, key=key, reward=1, votes=[1, 1, -1]),
        "negative": make_sample(author, key=key, reward=-1, votes=[-1, -1, 0]),
    }


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


def test_filters(team, mixed, api_as):
    api = api_as(team["owner"])
    url = "/api/review/samples/"
    assert ids(api.get(url)) == {s.pk for s in mixed.values()}
    assert ids(api.get(url, state="pending")) == {mixed["split"].pk, mixed["negative"].pk}
    assert ids(api.get(url, reward=-1)) == {mixed["negative"].pk}
    assert ids(api.get(url, flag="split_votes")) == {mixed["split"].pk, mixed["negative"].pk}
    assert ids(api.get(url, flag="none")) == {mixed["clean"].pk}
    assert ids(api.get(url, flag="new_key")) == set()
    assert ids(api.get(url, tenant=team["tenant"].pk, state="approved")) == {mixed["clean"].pk}
    bad = api.get(url, flag="nonsense")
    assert bad.status_code == 400 and "flag" in bad.json()["error"]["data"]["fields"]
    assert api.get(url, reward="x").status_code == 400
    assert api.get(url, state="weird").status_code == 400
    assert api.get(url, tenant=999999).status_code == 404


def test_detail_shows_the_conversation_response_and_hints(team, api_as):
    sample = make_sample(team["author"], key=team["author_key"], reward=0, votes=[0, 0, 0],
                         hints=["Answer in one sentence."], prompt="How do I list files?",
                         reply="Use ls.", next_text="Shorter please")
    body = api_as(team["admin"]).get(f"/api/review/samples/{sample.pk}/").json()
    assert body["messages"][-1] == {"role": "user", "content": "How do I list files?"}
    assert body["response"][0]["message"]["content"] == "Use ls."
    assert body["next_state"][0]["content"] == "Shorter please"
    assert body["hints"] == ["Answer in one sentence."] and body["has_hint"] is True
    assert body["raw_votes"] == ["\\boxed{0}"] * 3
    assert body["judge"] == {"name": "rule", "prompt_version": "test-v1"}
    assert body["user"]["email"] == team["author"].email


def test_reject_needs_a_reason(team, mixed, api_as):
    url = f"/api/review/samples/{mixed['split'].pk}/reject/"
    response = api_as(team["owner"]).post(url, {"reason": "  "})
    assert response.status_code == 400
    assert "reason" in response.json()["error"]["data"]["fields"]
    mixed["split"].refresh_from_db()
    assert mixed["split"].state == Sample.State.PENDING


def test_reject_then_approve_is_audited_each_time(team, mixed, api_as):
    api, sample = api_as(team["owner"]), mixed["split"]
    assert api.post(f"/api/review/samples/{sample.pk}/reject/", {"reason": "Looks coordinated"}).json()[
        "state"] == "rejected"
    body = api.post(f"/api/review/samples/{sample.pk}/approve/", {"reason": "Checked with the member"}).json()
    assert body["state"] == "approved" and body["reason"] == "Checked with the member"
    assert body["decided_by"]["email"] == team["owner"].email
    rows = list(AuditLog.objects.filter(target_type="sample", target_id=str(sample.pk)).order_by("id"))
    assert [(r.action, r.data["reason"], r.data["previous_state"]) for r in rows] == [
        ("sample.reject", "Looks coordinated", "pending"),
        ("sample.approve", "Checked with the member", "rejected"),
    ]
    assert all(r.group == team["group"] and r.data["flags"] == ["split_votes"] for r in rows)
    # The same decision again changes nothing and records nothing.
    api.post(f"/api/review/samples/{sample.pk}/approve/", {"reason": "Checked with the member"})
    assert AuditLog.objects.filter(target_type="sample", target_id=str(sample.pk)).count() == 2


def test_bulk_decides_all(team, mixed, api_as):
    chosen = [mixed["split"].pk, mixed["negative"].pk]
    response = api_as(team["admin"]).post("/api/review/samples/bulk/",
                                          {"ids": chosen, "action": "reject", "reason": "spam wave"})
    assert response.status_code == 200 and response.json()["count"] == 2
    assert set(Sample.objects.filter(pk__in=chosen).values_list("state", flat=True)) == {"rejected"}
    rows = AuditLog.objects.filter(action="sample.reject")
    assert rows.count() == 2 and all(r.data["bulk"] is True and r.data["reason"] == "spam wave" for r in rows)


def test_bulk_is_all_or_nothing(team, mixed, api_as):
    from tests.review.conftest import old_key

    outsider = team["other"]
    foreign = make_sample(outsider, key=old_key(outsider), reward=1, votes=[1, 0, 1])
    response = api_as(team["owner"]).post("/api/review/samples/bulk/", {
        "ids": [mixed["split"].pk, foreign.pk], "action": "approve"})
    assert response.status_code == 404
    mixed["split"].refresh_from_db()
    assert mixed["split"].state == "pending" and not AuditLog.objects.filter(action="sample.approve").exists()
    missing = api_as(team["owner"]).post("/api/review/samples/bulk/", {"ids": [999999], "action": "approve"})
    assert missing.status_code == 404 and missing.json()["error"]["data"]["ids"] == [999999]


def test_bulk_input_validation(team, mixed, api_as):
    api = api_as(team["owner"])
    assert api.post("/api/review/samples/bulk/", {"ids": [], "action": "approve"}).status_code == 400
    burn = api.post("/api/review/samples/bulk/", {"ids": [mixed["split"].pk], "action": "burn"})
    assert burn.status_code == 400
    no_reason = api.post("/api/review/samples/bulk/", {"ids": [mixed["split"].pk], "action": "reject"})
    assert no_reason.status_code == 400


def test_deleted_samples_cannot_be_revived(team, mixed, api_as):
    sample = mixed["split"]
    assert api_as(team["author"]).delete(f"/api/me/samples/{sample.pk}/").status_code == 204
    response = api_as(team["owner"]).post(f"/api/review/samples/{sample.pk}/approve/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "sample_deleted"
    sample.refresh_from_db()
    assert sample.state == Sample.State.DELETED


def test_trained_samples_cannot_be_rejected(team, mixed, api_as):
    sample = mixed["clean"]
    run = make_run(sample.tenant)
    Sample.objects.filter(pk=sample.pk).update(training_run=run, trained_at=timezone.now())
    response = api_as(team["owner"]).post(f"/api/review/samples/{sample.pk}/reject/", {"reason": "late"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "sample_trained"


def test_csrf_is_enforced_for_session_auth(team, mixed, api_as):
    api = api_as(team["owner"])
    response = api.client.post(f"/api/review/samples/{mixed['split'].pk}/approve/", {}, format="json")
    assert response.status_code == 403
    mixed["split"].refresh_from_db()
    assert mixed["split"].state == "pending"


def test_api_key_decides_only_with_the_admin_scope(team, mixed, api_client):
    from tests.factories import make_key

    _, plain = make_key(team["owner"])
    url = f"/api/review/samples/{mixed['split'].pk}/approve/"
    refused = api_client.post(url, {}, format="json", HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
    mixed["split"].refresh_from_db()
    assert mixed["split"].state == "pending"
    _, secret = make_key(team["owner"], scopes=["admin"])
    response = api_client.post(url, {}, format="json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200
    mixed["split"].refresh_from_db()
    assert mixed["split"].decided_by == team["owner"]


def test_review_policy(team, api_as):
    url = f"/api/review/tenants/{team['tenant'].pk}/policy/"
    owner = api_as(team["owner"])
    assert owner.get(url).json() == {"tenant": team["tenant"].pk, "mode": "flagged"}
    assert owner.patch(url, {"mode": "manual"}).json()["mode"] == "manual"
    assert ReviewPolicy.objects.get(tenant=team["tenant"]).mode == "manual"
    assert AuditLog.objects.filter(action="review.policy", group=team["group"]).exists()
    assert api_as(team["member"]).patch(url, {"mode": "auto"}).status_code == 403
    assert api_as(team["other"]).get(url).status_code == 404
    assert owner.patch(url, {"mode": "lax"}).status_code == 400
    # Under manual, even a clean sample waits.
    assert make_sample(team["author"], key=team["author_key"]).state == "pending"
