from datetime import timedelta

import pytest

from clawhub.accounts.models import AuditLog, User
from clawhub.accounts.services import audit_record
from clawhub.tenants.models import Tenant
from tests.factories import PASSWORD, make_key, make_user

pytestmark = pytest.mark.django_db
NEW_PASSWORD = "another-long-secret-42"


def _error(response):
    return response.json()["error"]


# CSRF -------------------------------------------------------------------------------------------------------

def test_csrf_endpoint_sets_the_cookie_and_returns_a_token(api_client):
    response = api_client.get("/api/auth/csrf/")
    assert response.status_code == 200
    assert response.json()["csrf_token"]
    assert "csrftoken" in response.cookies


@pytest.mark.parametrize("url, body", [
    ("/api/auth/login/", {"email": "c@example.com", "password": PASSWORD}),
    ("/api/auth/signup/", {"email": "new@example.com", "password": PASSWORD}),
    ("/api/auth/password/reset/", {"email": "c@example.com"}),
])
def test_anonymous_endpoints_refuse_a_post_without_csrf_token(api_client, mailoutbox, url, body):
    make_user("c@example.com")
    api_client.get("/api/auth/csrf/")  # the cookie alone is not enough: the token must be sent back
    response = api_client.post(url, body, format="json")
    assert response.status_code == 403
    assert _error(response)["code"] == "permission_denied"
    assert "CSRF" in _error(response)["message"]
    assert api_client.get("/api/me/").status_code in (401, 403)  # no session was started
    assert not User.objects.filter(email="new@example.com").exists()
    assert mailoutbox == []


def test_session_writes_refuse_a_post_without_csrf_token(api, api_client):
    make_user("c@example.com")
    assert api.login("c@example.com", PASSWORD).status_code == 200
    response = api_client.post("/api/auth/logout/", format="json")
    assert response.status_code == 403
    assert api.get("/api/me/").status_code == 200  # still logged in


# Sign-up, login, logout, me ---------------------------------------------------------------------------------

def test_signup_signs_nobody_in_and_the_login_after_it_shows_the_user(api):
    response = api.post("/api/auth/signup/", {"email": "New@Example.com", "password": PASSWORD,
                                              "display_name": "Nina"})
    assert response.status_code == 201, response.json()
    assert {k: v for k, v in response.json().items() if k != "csrf_token"} == \
        {"user": None, "logged_in": False, "email_verification_required": False}
    assert api.get("/api/me/").status_code in (401, 403)
    user = api.login("new@example.com", PASSWORD).json()["user"]
    me = api.get("/api/me/").json()
    tenant = Tenant.objects.get(kind=Tenant.Kind.USER, user_id=user["id"])
    assert me == user == {"id": user["id"], "email": "new@example.com", "display_name": "Nina",
                          "is_staff": False, "email_verified": False, "tenant_id": tenant.pk}


def test_signup_reports_weak_passwords_and_answers_taken_emails_neutrally(api, settings, mailoutbox):
    response = api.post("/api/auth/signup/", {"email": "new@example.com", "password": "12345"})
    assert response.status_code == 400
    assert _error(response)["code"] == "weak_password"
    assert _error(response)["data"]["fields"]["password"]
    # Taken: answered like a new account that waits for its link (no email_taken to enumerate accounts) ...
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    make_user("taken@example.com")
    taken = api.post("/api/auth/signup/", {"email": "taken@example.com", "password": PASSWORD}).json()
    fresh = api.post("/api/auth/signup/", {"email": "fresh@example.com", "password": PASSWORD}).json()
    assert {k: v for k, v in taken.items() if k != "csrf_token"} == \
        {k: v for k, v in fresh.items() if k != "csrf_token"} == \
        {"user": None, "logged_in": False, "email_verification_required": True}
    # ... and the address's owner is told someone tried.
    assert [m.to for m in mailoutbox] == [["taken@example.com"], ["fresh@example.com"]]
    assert "already has one" in mailoutbox[0].body


def test_login_and_logout(api):
    make_user("l@example.com")
    response = api.login("l@example.com", "wrong-password")
    assert response.status_code == 401
    assert _error(response)["code"] == "invalid_credentials"
    response = api.login("l@example.com", PASSWORD)
    assert response.status_code == 200
    assert response.json()["user"]["email"] == "l@example.com"
    assert api.get("/api/me/").status_code == 200
    assert api.post("/api/auth/logout/").status_code == 204
    assert api.get("/api/me/").status_code in (401, 403)


def test_login_requires_fields(api):
    response = api.post("/api/auth/login/", {"email": "l@example.com"})
    assert response.status_code == 400
    assert "password" in _error(response)["data"]["fields"]


def test_me_patch_changes_only_the_display_name(api):
    user = make_user("m@example.com")
    api.login("m@example.com", PASSWORD)
    response = api.patch("/api/me/", {"display_name": "Mia", "is_staff": True, "email": "x@example.com"})
    assert response.status_code == 200
    assert response.json()["display_name"] == "Mia"
    user.refresh_from_db()
    assert (user.display_name, user.is_staff, user.email) == ("Mia", False, "m@example.com")


def test_me_names_the_personal_tenant_the_training_api_takes(api):
    make_user("other@example.com")  # another user's tenant, so a wrong id cannot pass by chance
    user = make_user("t@example.com")
    api.login("t@example.com", PASSWORD)
    tenant_id = api.get("/api/me/").json()["tenant_id"]
    assert tenant_id == Tenant.objects.get(kind=Tenant.Kind.USER, user=user).pk
    assert api.get(f"/api/training/tenants/{tenant_id}/runs/").status_code == 200
    # PATCH answers with the same representation of /api/me/.
    assert api.patch("/api/me/", {"display_name": "T"}).json()["tenant_id"] == tenant_id


def test_me_works_with_a_read_key_but_password_change_does_not(api_client):
    user = make_user("k@example.com")
    _, plain = make_key(user)
    assert api_client.get("/api/me/", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 403
    _, secret = make_key(user, scopes=["read", "keys", "export", "admin"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    assert api_client.get("/api/me/", **auth).json()["email"] == "k@example.com"
    response = api_client.post("/api/auth/password/change/",
                               {"old_password": PASSWORD, "new_password": NEW_PASSWORD},
                               format="json", **auth)
    assert response.status_code in (401, 403)
    user.refresh_from_db()
    assert user.check_password(PASSWORD)


# Throttling -------------------------------------------------------------------------------------------------

def test_after_the_limit_even_the_right_password_gets_429_with_retry_after(api, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_WINDOW = timedelta(minutes=10)
    make_user("victim@example.com")
    make_user("bystander@example.com")
    for _ in range(3):
        assert api.login("victim@example.com", "guess", REMOTE_ADDR="10.9.0.1").status_code == 401
    response = api.login("victim@example.com", PASSWORD, REMOTE_ADDR="10.9.0.1")
    assert response.status_code == 429
    assert _error(response)["code"] == "rate_limited"
    assert 0 < int(response["Retry-After"]) <= 600
    # Finding N14: the lock is the guesser's (this account from this address). The owner elsewhere, and
    # someone else behind the same address (a NAT, the embedded server's 127.0.0.1), still sign in.
    assert api.login("victim@example.com", PASSWORD, REMOTE_ADDR="10.9.0.2").status_code == 200
    api.post("/api/auth/logout/")
    assert api.login("bystander@example.com", PASSWORD, REMOTE_ADDR="10.9.0.1").status_code == 200


def test_guessing_spread_over_addresses_or_accounts_is_locked_too(api, settings):
    settings.LOGIN_FAILURE_ACCOUNT_LIMIT = 4
    settings.LOGIN_FAILURE_IP_LIMIT = 4
    make_user("target@example.com")
    regular = make_user("regular@example.com")
    assert api.login(regular.email, PASSWORD, REMOTE_ADDR="10.7.0.1").status_code == 200  # known there
    api.post("/api/auth/logout/")
    for n in range(4):  # one account from many addresses
        api.login("target@example.com", "guess", REMOTE_ADDR=f"10.6.0.{n}")
    assert api.login("target@example.com", PASSWORD, REMOTE_ADDR="10.6.1.1").status_code == 429
    for n in range(4):  # many accounts from one address
        api.login(f"sprayed{n}@example.com", "guess", REMOTE_ADDR="10.7.0.1")
    make_user("newcomer@example.com")
    assert api.login("newcomer@example.com", PASSWORD, REMOTE_ADDR="10.7.0.1").status_code == 429
    # An account that signed in from that address before is spared the address's lock.
    assert api.login(regular.email, PASSWORD, REMOTE_ADDR="10.7.0.1").status_code == 200


def test_a_successful_login_clears_the_email_counter(api, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    make_user("l@example.com")
    for n in range(2):
        api.login("l@example.com", "guess", REMOTE_ADDR=f"10.8.0.{n}")
    assert api.login("l@example.com", PASSWORD, REMOTE_ADDR="10.8.1.1").status_code == 200
    api.post("/api/auth/logout/")
    for n in range(2):
        api.login("l@example.com", "guess", REMOTE_ADDR=f"10.8.2.{n}")
    assert api.login("l@example.com", PASSWORD, REMOTE_ADDR="10.8.3.1").status_code == 200


# Passwords --------------------------------------------------------------------------------------------------

def test_password_change_keeps_the_session_and_the_new_password_works(api, api_client):
    make_user("p@example.com")
    api.login("p@example.com", PASSWORD)
    response = api.post("/api/auth/password/change/", {"old_password": "wrong", "new_password": NEW_PASSWORD})
    assert response.status_code == 403 and _error(response)["code"] == "wrong_password"
    assert "old_password" in _error(response)["data"]["fields"]
    response = api.post("/api/auth/password/change/",
                        {"old_password": PASSWORD, "new_password": NEW_PASSWORD})
    assert response.status_code == 200
    assert api.get("/api/me/").status_code == 200
    api.post("/api/auth/logout/")
    assert api.login("p@example.com", PASSWORD).status_code == 401
    assert api.login("p@example.com", NEW_PASSWORD).status_code == 200


def test_password_change_ends_the_other_sessions(api, api_client):
    from rest_framework.test import APIClient

    from tests.accounts.conftest import BrowserApi

    make_user("p@example.com")
    other = BrowserApi(APIClient(enforce_csrf_checks=True))
    other.login("p@example.com", PASSWORD)
    api.login("p@example.com", PASSWORD)
    api.post("/api/auth/password/change/", {"old_password": PASSWORD, "new_password": NEW_PASSWORD})
    assert other.get("/api/me/").status_code in (401, 403)


def test_password_reset_flow_without_account_enumeration(api, mailoutbox, mail_link):
    make_user("r@example.com")
    unknown = api.post("/api/auth/password/reset/", {"email": "nobody@example.com"})
    known = api.post("/api/auth/password/reset/", {"email": "r@example.com"})
    assert unknown.status_code == known.status_code == 202
    assert unknown.json() == known.json()
    assert len(mailoutbox) == 1
    _, _, uid, token, _ = mail_link(mailoutbox[0], "/password-reset/").split("/")
    response = api.post("/api/auth/password/reset/confirm/",
                        {"uid": uid, "token": token, "new_password": "x"})
    assert response.status_code == 400 and "new_password" in _error(response)["data"]["fields"]
    response = api.post("/api/auth/password/reset/confirm/",
                        {"uid": uid, "token": token, "new_password": NEW_PASSWORD})
    assert response.status_code == 200
    response = api.post("/api/auth/password/reset/confirm/",
                        {"uid": uid, "token": token, "new_password": "third-long-secret-99"})
    assert response.status_code == 400 and _error(response)["code"] == "invalid_token"
    assert api.login("r@example.com", NEW_PASSWORD).status_code == 200


# Email verification -----------------------------------------------------------------------------------------

def test_verification_flow(api, settings, mailoutbox, mail_link):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    response = api.post("/api/auth/signup/", {"email": "v@example.com", "password": PASSWORD})
    assert response.status_code == 201
    assert response.json()["logged_in"] is False and response.json()["email_verification_required"] is True
    assert api.get("/api/me/").status_code in (401, 403)

    response = api.login("v@example.com", PASSWORD)
    assert response.status_code == 401
    assert _error(response)["code"] == "email_unverified"
    assert "Confirm your email" in _error(response)["message"]

    assert api.post("/api/auth/verify-email/resend/", {"email": "v@example.com"}).status_code == 202
    assert len(mailoutbox) == 2
    token = mail_link(mailoutbox[1], "/verify-email/").split("/")[2]
    assert api.post("/api/auth/verify-email/", {"token": "bogus"}).status_code == 400
    response = api.post("/api/auth/verify-email/", {"token": token})
    assert response.status_code == 200 and response.json()["user"]["email_verified"] is True
    assert api.login("v@example.com", PASSWORD).status_code == 200


def test_resend_answers_the_same_for_unknown_addresses(api, mailoutbox):
    response = api.post("/api/auth/verify-email/resend/", {"email": "nobody@example.com"})
    assert response.status_code == 202
    assert mailoutbox == []


# Audit ------------------------------------------------------------------------------------------------------

def _audit(api, user, query=""):
    api.login(user.email, PASSWORD)
    return api.get(f"/api/audit/{query}")


@pytest.mark.parametrize("role, status", [
    ("owner", 200), ("admin", 200), ("staff", 200), ("member", 403), ("viewer", 403), ("outsider", 404),
])
def test_group_audit_visibility_by_role(api, roles, role, status):
    group = roles["group"]
    response = _audit(api, roles[role], f"?group={group.slug}")
    assert response.status_code == status
    if status == 200:
        assert "group.create" in [row["action"] for row in response.json()["results"]]
        assert all(row["group"] == group.slug for row in response.json()["results"])


def test_unknown_group_is_404(api, roles):
    assert _audit(api, roles["staff"], "?group=no-such-group").status_code == 404


def test_own_rows_by_default_and_everything_for_staff_only(api, roles):
    owner, member = roles["owner"], roles["member"]
    audit_record(actor=owner, action="test.to_member", target=member, subject_user=member, ip="10.3.3.3")
    audit_record(actor=owner, action="test.private", target=owner, subject_user=owner)
    rows = _audit(api, member).json()["results"]
    assert [r["action"] for r in rows] == ["auth.login", "test.to_member"]  # the member's own sign-in too
    assert rows[1]["actor"] == owner.email and rows[1]["ip"] is None  # not the member's address
    assert api.get("/api/audit/?all=1").status_code == 403
    api.post("/api/auth/logout/")
    everything = _audit(api, roles["staff"], "?all=1").json()
    assert everything["count"] == AuditLog.objects.count()


def test_ip_is_shown_only_to_staff_and_to_the_actor(api, roles):
    group, owner, admin = roles["group"], roles["owner"], roles["admin"]
    audit_record(actor=owner, action="test.owner_did", target=group, group=group, ip="10.1.2.3")
    rows = _audit(api, admin, f"?group={group.slug}").json()["results"]
    assert next(r for r in rows if r["action"] == "test.owner_did")["ip"] is None
    api.post("/api/auth/logout/")
    rows = _audit(api, owner, f"?group={group.slug}").json()["results"]
    assert next(r for r in rows if r["action"] == "test.owner_did")["ip"] == "10.1.2.3"


def test_audit_is_paginated(api, user):
    for n in range(7):
        audit_record(actor=user, action=f"test.row{n}", target=user, subject_user=user)
    api.login(user.email, PASSWORD)
    page1 = api.get("/api/audit/?page_size=5").json()
    assert page1["count"] == 8 and len(page1["results"]) == 5 and page1["next"]
    assert [r["action"] for r in page1["results"][:2]] == ["auth.login", "test.row6"]  # newest first
    page2 = api.get("/api/audit/?page_size=5&page=2").json()
    assert [r["action"] for r in page2["results"]] == ["test.row2", "test.row1", "test.row0"]


def test_audit_needs_authentication(api_client):
    assert api_client.get("/api/audit/").status_code in (401, 403)
