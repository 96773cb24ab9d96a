"""Users' own data: their samples, the privacy switches, export, account deletion and retention."""

import json
from datetime import date, timedelta

import pytest
from django.utils import timezone

from clawhub.accounts.models import AuditLog, User
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.privacy import capture_allowed, capture_allowed_many, turns_purge_older_than
from clawhub.feedback.models import Judgment
from clawhub.groups.models import Group, Membership, Role
from clawhub.groups.services import membership_change_role
from clawhub.keys.models import ApiKey
from clawhub.review.models import Sample
from clawhub.tenants.models import Tenant
from clawhub.usage.models import UsageDaily
from tests.factories import PASSWORD, add_member, make_group, make_key, make_user
from tests.review.conftest import make_judgment, make_sample, make_turn, old_key

pytestmark = pytest.mark.django_db


# --- my samples ---------------------------------------------------------------------------------------------


def test_my_samples_lists_only_mine_with_state(team, pending_sample, api_as):
    mine = api_as(team["author"]).get("/api/me/samples/").json()["results"]
    assert [(s["id"], s["state"]) for s in mine] == [(pending_sample.pk, "pending")]
    assert "decided_by" not in mine[0]
    assert api_as(team["member"]).get("/api/me/samples/").json()["results"] == []


def test_delete_my_sample(team, pending_sample, api_as):
    assert api_as(team["member"]).delete(f"/api/me/samples/{pending_sample.pk}/").status_code == 404
    api = api_as(team["author"])
    assert api.delete(f"/api/me/samples/{pending_sample.pk}/").status_code == 204
    pending_sample.refresh_from_db()
    assert pending_sample.state == Sample.State.DELETED
    row = AuditLog.objects.get(action="sample.delete")
    assert (row.actor, row.group, row.data["previous_state"]) == (team["author"], team["group"], "pending")
    # Deleting again is harmless and records nothing new.
    assert api.delete(f"/api/me/samples/{pending_sample.pk}/").status_code == 204
    assert AuditLog.objects.filter(action="sample.delete").count() == 1


# --- switches -----------------------------------------------------------------------------------------------


def test_privacy_switches(api_as):
    user = make_user()
    key = old_key(user)
    api = api_as(user)
    assert api.get("/api/me/privacy/").json() == {
        "training_enabled": True, "store_turns": True,
        "keys": [{"id": key.pk, "name": key.name, "display": key.display, "training_enabled": True}]}
    assert capture_allowed(user.pk, key.pk) == (True, True)
    body = api.patch("/api/me/privacy/", {"training_enabled": False}).json()
    assert (body["training_enabled"], body["store_turns"]) == (False, True)
    assert capture_allowed(user.pk, key.pk) == (True, False)
    api.patch("/api/me/privacy/", {"training_enabled": True, "store_turns": False})
    assert capture_allowed(user.pk, key.pk) == (False, False)
    row = AuditLog.objects.filter(action="user.privacy").latest("id")
    assert row.data["store_turns"] == {"old": True, "new": False}
    assert api.patch("/api/me/privacy/", {"store_turns": "maybe"}).status_code == 400


def test_key_training_switch(api_as):
    user, stranger = make_user(), make_user()
    key = old_key(user)
    assert api_as(stranger).patch(f"/api/me/keys/{key.pk}/training/",
                                  {"training_enabled": False}).status_code == 404
    response = api_as(user).patch(f"/api/me/keys/{key.pk}/training/", {"training_enabled": False})
    assert response.json() == {"id": key.pk, "training_enabled": False}
    assert capture_allowed(user.pk, key.pk) == (True, False)
    assert capture_allowed(user.pk, None) == (True, True)
    assert AuditLog.objects.filter(action="key.training", target_id=str(key.pk)).exists()
    # A sample judged afterwards through that key is not made at all.
    assert make_sample(user, key=ApiKey.objects.get(pk=key.pk)) is None


def test_capture_allowed_many_and_unknown_users():
    on, off = make_user(), make_user(store_turns=False)
    key = old_key(on)
    assert capture_allowed_many([(on.pk, key.pk), (off.pk, None), (999999, None)]) == {
        (on.pk, key.pk): (True, True), (off.pk, None): (False, False), (999999, None): (False, False)}


# --- export -------------------------------------------------------------------------------------------------


def _life(user, group, *, secret_word: str):
    """A personal key and a group key, a personal and a group turn (judged, sampled), usage, audit rows, and
    a key the playground minted."""
    from clawhub.keys.services import playground_key_mint

    personal = old_key(user, name=f"{secret_word} personal key")
    shared = old_key(user, group=group, name=f"{secret_word} group key")
    s1 = make_sample(user, key=personal, prompt=f"{secret_word} personal prompt",
                     next_text=f"{secret_word} thanks")
    s2 = make_sample(user, key=shared, prompt=f"{secret_word} group prompt", reward=-1,
                     next_text=f"{secret_word} wrong", hints=[f"{secret_word} hint"])
    UsageDaily.objects.create(day=date(2026, 5, 1), key=shared, user=user, group=group, tenant=group.tenant,
                              model=group.tenant.model_id, requests=3, prompt_tokens=30, completion_tokens=9)
    playground = playground_key_mint(actor=user)[0]
    return {"keys": [personal, shared, playground], "samples": [s1, s2]}


def test_export_contains_everything_of_the_user_and_nothing_of_anyone_else(api_as):
    owner = make_user(display_name="Olga Owner")
    group = make_group(owner)
    alice = add_member(group, make_user(email="alice@example.com", display_name="Alice"))
    bob = add_member(group, make_user(email="bob@example.com", display_name="Bobby"))
    mine = _life(alice, group, secret_word="aardvark")
    theirs = _life(bob, group, secret_word="zebra")
    # Bob is the subject of a role change by the owner; Alice of nothing of the kind.
    membership_change_role(actor=owner, group=group, user=bob, role=Role.VIEWER)

    response = api_as(alice).get("/api/me/export/")
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    data = response.json()
    text = json.dumps(data)

    assert data["profile"]["email"] == "alice@example.com" and data["profile"]["training_enabled"] is True
    assert {k["id"] for k in data["keys"]} == {k.pk for k in mine["keys"]}
    assert all("digest" not in k and "secret" not in k for k in data["keys"])
    assert [k["playground"] for k in data["keys"]].count(True) == 1
    assert data["memberships"] == [{"group": {"id": group.pk, "slug": group.slug, "name": group.name},
                                    "role": "member", "joined_at": data["memberships"][0]["joined_at"]}]
    mine_turns = {s.turn_id for s in mine["samples"]}
    assert {t["id"] for t in data["turns"]} == mine_turns
    assert {s["id"] for s in data["sessions"]} == set(
        Turn.objects.filter(pk__in=mine_turns).values_list("session_id", flat=True))
    assert {j["turn_id"] for j in data["judgments"]} == mine_turns
    assert {s["id"] for s in data["samples"]} == {s.pk for s in mine["samples"]}
    assert [u["requests"] for u in data["usage"]] == [3]
    assert "aardvark personal prompt" in text and "aardvark hint" in text
    created = {r["target_id"] for r in data["audit"] if r["action"] == "key.create" and r["by"] == "you"}
    assert created == {str(k.pk) for k in mine["keys"]}

    # Nothing of Bob's, nor of the owner's, in any form.
    for leak in ("zebra", "bob@example.com", "Bobby", "Olga Owner", owner.email):
        assert leak not in text, leak
    # Where Alice is signed in (each client's session is recorded after its first request), without the keys.
    client = api_as(alice)
    export = client.get("/api/me/export/").content.decode()
    signed_in = json.loads(export)["signed_in"]
    assert [s["ip"] for s in signed_in] == ["127.0.0.1"] and "session_key" not in signed_in[0]
    from clawhub.accounts.models import UserSession

    assert all(key not in export for key in UserSession.objects.values_list("session_key", flat=True))
    assert not {s.pk for s in theirs["samples"]} & {s["id"] for s in data["samples"]}


def test_export_keeps_the_users_own_actions_on_others_without_their_details(api_as):
    owner = make_user()
    group = make_group(owner)
    victim = add_member(group, make_user(email="victim@example.com"))
    membership_change_role(actor=owner, group=group, user=victim, role=Role.VIEWER)
    data = api_as(owner).get("/api/me/export/").json()
    row = next(r for r in data["audit"] if r["action"] == "membership.change_role")
    assert row["by"] == "you" and row["data"] == {} and row["target"] == ""
    assert "victim@example.com" not in json.dumps(data)
    # The victim sees it as something done to them, not who did it.
    victim_row = next(r for r in api_as(victim).get("/api/me/export/").json()["audit"]
                      if r["action"] == "membership.change_role")
    assert victim_row["by"] == "someone else" and victim_row["data"]["role"] == "viewer"


# --- account deletion ---------------------------------------------------------------------------------------


def test_account_deletion_removes_the_user_and_all_their_data(api_as):
    owner = make_user()
    group = make_group(owner)
    leaver = add_member(group, make_user(email="leaver@example.com"))
    stayer = add_member(group)
    mine = _life(leaver, group, secret_word="gone")
    kept = _life(stayer, group, secret_word="kept")
    solo = make_group(leaver, name="Solo club")
    tenant_id = leaver.tenant.pk

    api = api_as(leaver)
    assert api.post("/api/me/delete/", {"password": "wrong password"}).status_code == 403
    assert User.objects.filter(pk=leaver.pk).exists()
    response = api.post("/api/me/delete/", {"password": PASSWORD})
    assert response.status_code == 200
    assert response.json()["groups_kept"] == [group.slug]  # said plainly: the shared adapter stays

    assert not User.objects.filter(pk=leaver.pk).exists()
    assert not Tenant.objects.filter(pk=tenant_id).exists()
    assert not Group.objects.filter(pk=solo.pk).exists()
    assert not Membership.objects.filter(user_id=leaver.pk).exists()
    assert not ApiKey.objects.filter(pk__in=[k.pk for k in mine["keys"]]).exists()
    assert not Turn.objects.filter(user_id=leaver.pk).exists()
    assert not Session.objects.filter(user_id=leaver.pk).exists()
    assert not Sample.objects.filter(pk__in=[s.pk for s in mine["samples"]]).exists()
    assert not Judgment.objects.filter(turn_id__in=[s.turn_id for s in mine["samples"]]).exists()
    assert not UsageDaily.objects.filter(user_id=leaver.pk).exists()
    # The group and the other member's data are untouched.
    assert Group.objects.filter(pk=group.pk).exists()
    assert Sample.objects.filter(pk__in=[s.pk for s in kept["samples"]]).count() == 2
    # Keys were revoked (gateways drop them) before they went; the audit trail keeps actions, not the name.
    revoked = AuditLog.objects.filter(action="key.revoke", data__reason="account deleted")
    assert revoked.count() == len(mine["keys"])
    assert AuditLog.objects.filter(action="user.delete", data__user_id=leaver.pk).exists()
    assert not AuditLog.objects.filter(target_repr__icontains="leaver@example.com").exists()
    # The session is over.
    assert api.get("/api/me/samples/").status_code in (401, 403)


def test_an_owner_with_members_must_transfer_first(api_as):
    owner = make_user()
    group = make_group(owner)
    add_member(group)
    response = api_as(owner).post("/api/me/delete/", {"password": PASSWORD})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "owner_must_transfer"
    assert response.json()["error"]["data"]["groups"] == [group.slug]
    assert User.objects.filter(pk=owner.pk).exists() and Group.objects.filter(pk=group.pk).exists()


# --- retention ----------------------------------------------------------------------------------------------


def test_retention_purges_old_turns_with_their_judgments_and_samples(settings):
    user = make_user()
    key = old_key(user)
    old = make_turn(user, key=key, created_at=timezone.now() - timedelta(days=100))
    Session.objects.filter(pk=old.session_id).update(last_activity_at=old.created_at)
    old_judgment = make_judgment(old, reward=1)
    old_sample = Sample.objects.create(turn=old, judgment=old_judgment, tenant=user.tenant, user=user,
                                       key=key, reward=1, state="approved", trained_at=timezone.now())
    recent = make_sample(user, key=key)

    settings.CLAWHUB_RETENTION_DAYS = 0
    assert turns_purge_older_than() == 0
    assert Turn.objects.filter(pk=old.pk).exists()

    settings.CLAWHUB_RETENTION_DAYS = 90
    assert turns_purge_older_than() == 1
    assert not Turn.objects.filter(pk=old.pk).exists()
    assert not Judgment.objects.filter(pk=old_judgment.pk).exists()
    assert not Sample.objects.filter(pk=old_sample.pk).exists()  # trained ones too: the text goes
    assert not Session.objects.filter(pk=old.session_id).exists()
    assert Sample.objects.filter(pk=recent.pk).exists() and Turn.objects.filter(pk=recent.turn_id).exists()


def test_retention_in_small_batches():
    user = make_user()
    for _ in range(5):
        make_turn(user, created_at=timezone.now() - timedelta(days=40))
    make_turn(user)
    assert turns_purge_older_than(days=30, batch_size=2) == 5
    assert Turn.objects.count() == 1


def test_retention_task_calls_the_purge(settings, tmp_path):
    from workers.tasks.retention import purge

    settings.CAPTURE_SPOOL_DIR = str(tmp_path)  # an empty spool (tests/security/test_account_deletion.py)
    user = make_user()
    make_turn(user, created_at=timezone.now() - timedelta(days=200))
    settings.CLAWHUB_RETENTION_DAYS = 90
    assert purge.apply().get() == {"turns_deleted": 1, "spool_records_emptied": 0}
    assert purge.name == "clawhub.retention.purge"


def test_make_key_helper_is_new(db):
    # Guards the conftest: keys made with make_key are new; old_key ones are not.
    user = make_user()
    assert make_key(user)[0].created_at > timezone.now() - timedelta(minutes=1)
    assert old_key(user).created_at < timezone.now() - timedelta(days=1)
