"""Finding 1: a key stolen from ~/.openclaw/openclaw.json must not unlock the account.

Each test plays the thief with the key an agent holds (the default, inference-only) and checks that what the
review found it could do is now refused, and that nothing changed.
"""

import importlib
import re

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.tokens import default_token_generator
from django.core import mail
from django.test import Client
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from rest_framework.test import APIClient

from clawhub.accounts.models import AuditLog
from clawhub.groups.models import Invitation, Membership, Role
from clawhub.keys.models import ApiKey
from clawhub.keys.selectors import key_resolve
from clawhub.keys.services import key_rotate
from tests.factories import add_member, make_group, make_key, make_user
from tests.keys.conftest import login

pytestmark = pytest.mark.django_db


@pytest.fixture
def web_client():
    return Client(enforce_csrf_checks=True)


def thief(secret: str) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def refused(response) -> bool:
    return response.status_code == 403 and response.json()["error"]["code"] == "insufficient_scope"


def test_a_stolen_agent_key_cannot_mint_export_rotate_invite_or_take_over():
    owner = make_user()
    group = make_group(owner)
    heir = add_member(group, make_user(), Role.MEMBER)
    key, secret = make_key(owner)
    assert key.scopes == ["inference"]
    api = thief(secret)

    assert refused(api.post("/api/keys/", {"name": "mine now", "scopes": ["export"]}, format="json"))
    assert ApiKey.objects.filter(owner=owner).count() == 1
    assert refused(api.get("/api/me/export/"))
    sessions = api.get("/api/sessions/")
    assert refused(sessions)
    # The message names the scope as a user writes it.
    assert "lacks the 'read' scope (it has: inference)" in sessions.json()["error"]["message"]
    assert refused(api.post(f"/api/keys/{key.pk}/rotate/"))
    assert key_resolve(secret=secret) is not None  # still the owner's to rotate, and the thief has no new one
    assert refused(api.post(f"/api/groups/{group.slug}/invitations/", {"role": "admin"}, format="json"))
    assert not Invitation.objects.exists()
    assert refused(api.post(f"/api/groups/{group.slug}/transfer/", {"user_id": heir.pk}, format="json"))
    assert Membership.objects.get(group=group, role=Role.OWNER).user == owner
    # What the key is for still works: the gateway resolves it.
    assert key_resolve(secret=secret).scopes == ["inference"]


def test_a_keys_scope_cannot_grant_more_than_it_holds_nor_rotate_itself():
    owner = make_user()
    key, secret = make_key(owner, scopes=["keys"])
    api = thief(secret)
    escalate = api.post("/api/keys/", {"name": "x", "scopes": ["export"]}, format="json")
    assert escalate.status_code == 403 and escalate.json()["error"]["code"] == "insufficient_scope"
    assert ApiKey.objects.filter(owner=owner).count() == 1
    widen = api.patch(f"/api/keys/{key.pk}/", {"scopes": ["keys", "admin"]}, format="json")
    assert widen.status_code == 403
    key.refresh_from_db()
    assert key.scopes == ["inference", "keys"]
    itself = api.post(f"/api/keys/{key.pk}/rotate/")
    assert itself.status_code == 403 and itself.json()["error"]["code"] == "self_rotation"
    # A narrower key it may make.
    assert api.post("/api/keys/", {"name": "agent"}, format="json").json()["key"]["scopes"] == ["inference"]


def test_a_keys_scope_cannot_rotate_its_way_to_a_wider_key():
    owner = make_user()
    wide, wide_secret = make_key(owner, scopes=["read", "keys", "export", "admin"])
    narrow, narrow_secret = make_key(owner, scopes=["keys"])
    api = thief(narrow_secret)
    response = api.post(f"/api/keys/{wide.pk}/rotate/")
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "insufficient_scope" and "export" in error["message"]
    assert "secret" not in response.json()
    # Nothing changed: the wide key keeps its one secret, and no new one exists.
    assert key_resolve(secret=wide_secret).current
    assert wide.secrets.count() == 1
    # Nor may it change the wider key (lift its expiry, widen its models).
    changed = api.patch(f"/api/keys/{wide.pk}/", {"expires_at": None, "name": "mine"}, format="json")
    assert changed.status_code == 403 and changed.json()["error"]["code"] == "insufficient_scope"
    wide.refresh_from_db()
    assert wide.name != "mine"
    # A key no wider than the asking one it may rotate, and the new secret holds no more than it does.
    agent, _ = make_key(owner)
    rotated = api.post(f"/api/keys/{agent.pk}/rotate/")
    assert rotated.status_code == 200
    assert key_resolve(secret=rotated.json()["secret"]).scopes == ["inference"]
    # The owner, signed in, may rotate any of their keys.
    assert key_rotate(key=wide, actor=owner)


def test_a_rotated_out_secret_is_inference_only_even_on_an_all_scopes_key():
    owner = make_user()
    key, old = make_key(owner, scopes=["read", "keys", "export", "admin"])
    new = key_rotate(key=key, actor=owner)
    assert key_resolve(secret=old).scopes == ["inference"]
    assert refused(thief(old).get("/api/me/"))
    assert refused(thief(old).get("/api/me/export/"))
    assert thief(new).get("/api/me/export/").status_code == 200


def test_sensitive_actions_by_session_need_csrf():
    owner = make_user()
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post("/api/keys/", {"name": "no token"}, format="json")
    assert response.status_code == 403 and "CSRF" in response.json()["error"]["message"]
    assert not ApiKey.objects.exists()


def test_scopes_are_shown_plainly_on_the_key_pages(web_client):
    owner = make_user()
    key, _ = make_key(owner, scopes=["read"])
    login(web_client, owner)
    detail = web_client.get(f"/keys/{key.pk}/").content.decode()
    assert "<code>inference</code>" in detail and "<code>read</code>" in detail
    assert "<code>export</code>" not in detail.split("<h2>Change</h2>")[0]
    listing = web_client.get("/keys/").content.decode()
    assert "inference, read" in listing
    # The create form offers the management scopes unticked.
    assert re.search(r'<input type="checkbox" name="scopes" value="export"(?![^>]*checked)', listing)


def test_sign_out_everywhere_ends_other_sessions_and_keeps_keys():
    user = make_user()
    _, secret = make_key(user, scopes=["read"])
    laptop = login(APIClient(enforce_csrf_checks=True), user)
    phone = login(APIClient(enforce_csrf_checks=True), user)
    assert phone.get("/api/me/").status_code == 200
    assert laptop.post("/api/auth/logout-everywhere/").status_code == 204
    assert phone.get("/api/me/").status_code in (401, 403)
    assert laptop.get("/api/me/").status_code in (401, 403)
    assert thief(secret).get("/api/me/").status_code == 200
    assert AuditLog.objects.filter(action="user.sessions_end_all", subject_user=user).exists()
    # Only a session may do it.
    assert thief(secret).post("/api/auth/logout-everywhere/").status_code == 403


def _reset(client, user, *, revoke_keys):
    body = {"uid": urlsafe_base64_encode(force_bytes(user.pk)),
            "token": default_token_generator.make_token(user), "new_password": "a-much-newer-password-77",
            "revoke_keys": revoke_keys}
    client.get("/api/auth/csrf/")
    client.credentials(HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    return client.post("/api/auth/password/reset/confirm/", body, format="json")


@pytest.mark.parametrize("revoke_keys", [True, False])
def test_a_password_reset_offers_to_revoke_every_key(revoke_keys):
    user = make_user(email_verified_at=timezone.now())
    _, secret = make_key(user)
    assert _reset(APIClient(enforce_csrf_checks=True), user, revoke_keys=revoke_keys).status_code == 200
    assert (key_resolve(secret=secret) is None) is revoke_keys


def test_the_reset_page_offers_the_revocation_ticked(web_client):
    user = make_user()
    uid, token = urlsafe_base64_encode(force_bytes(user.pk)), default_token_generator.make_token(user)
    path = f"/password-reset/{uid}/{token}/"
    page = web_client.get(path, follow=True).content.decode()
    assert re.search(r'name="revoke_keys"[^>]*checked', page)


def test_a_squatters_key_dies_when_the_real_owner_first_proves_the_mailbox():
    """Pre-account takeover: someone registers victim@… before the victim, mints a key, and waits. The
    victim later resets the password (which verifies the address); the squatter's key and session die."""
    squatter = APIClient(enforce_csrf_checks=True)
    account = make_user("victim@example.com")
    assert account.email_verified_at is None
    login(squatter, account)
    _, secret = make_key(account)
    assert _reset(APIClient(enforce_csrf_checks=True), account, revoke_keys=False).status_code == 200
    assert key_resolve(secret=secret) is None
    assert squatter.get("/api/me/").status_code in (401, 403)
    account.refresh_from_db()
    assert account.email_verified_at is not None
    # After that first verification, keys are the owner's and survive later resets they choose to keep.
    _, kept = make_key(account)
    assert _reset(APIClient(enforce_csrf_checks=True), account, revoke_keys=False).status_code == 200
    assert key_resolve(secret=kept) is not None


def test_the_verification_link_followed_elsewhere_ends_keys_made_before_it(settings, client):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = False
    account = make_user("late@example.com")
    _, secret = make_key(account)
    from clawhub.accounts.services import email_verification_send

    email_verification_send(user=account)
    link = re.search(r"https?://\S+/verify-email/\S+/", mail.outbox[-1].body).group(0)
    client.get("/" + link.split("://", 1)[1].split("/", 1)[1])
    account.refresh_from_db()
    assert account.email_verified_at is not None
    assert key_resolve(secret=secret) is None


def test_the_same_person_verifying_while_signed_in_keeps_their_keys(client):
    account = make_user("me@example.com")
    _, secret = make_key(account)
    from clawhub.accounts.services import email_verification_send

    email_verification_send(user=account)
    link = re.search(r"https?://\S+/verify-email/\S+/", mail.outbox[-1].body).group(0)
    client.force_login(account)
    client.get("/" + link.split("://", 1)[1].split("/", 1)[1])
    account.refresh_from_db()
    assert account.email_verified_at is not None
    assert key_resolve(secret=secret) is not None


def test_the_same_person_confirming_through_the_api_keeps_their_sessions_and_keys():
    """Finding N9: DRF replaced the Django request's user with the view's (nobody: the view authenticates no
    one), so a signed-in user confirming their own address through the API was treated as a stranger and lost
    every session and key."""
    account = make_user("api-me@example.com")
    _, secret = make_key(account)
    from clawhub.accounts.services import email_verification_send

    email_verification_send(user=account)
    token = re.search(r"/verify-email/([^/\s]+)/", mail.outbox[-1].body).group(1)
    me = login(APIClient(enforce_csrf_checks=True), account)
    elsewhere = login(APIClient(enforce_csrf_checks=True), account)
    response = me.post("/api/auth/verify-email/", {"token": token}, format="json")
    assert response.status_code == 200 and response.json()["user"]["email_verified"] is True
    assert key_resolve(secret=secret) is not None
    assert me.get("/api/me/").status_code == 200
    assert elsewhere.get("/api/me/").status_code == 200
    # Signed in as someone else, the same kind of link still ends what was made before it.
    other = make_user("api-other@example.com")
    _, other_secret = make_key(other)
    email_verification_send(user=other)
    token = re.search(r"/verify-email/([^/\s]+)/", mail.outbox[-1].body).group(1)
    assert me.post("/api/auth/verify-email/", {"token": token}, format="json").status_code == 200
    assert key_resolve(secret=other_secret) is None


def test_existing_keys_migrate_to_inference_only():
    owner = make_user()
    key, _ = make_key(owner, scopes=["read", "admin"])
    migration = importlib.import_module("clawhub.keys.migrations.0003_scopes")
    migration.existing_keys_inference_only(django_apps, None)
    key.refresh_from_db()
    assert key.scopes == ["inference"]

