from datetime import timedelta

import pytest
from django.contrib.auth.tokens import default_token_generator
from django.contrib.sessions.middleware import SessionMiddleware
from django.test import RequestFactory
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from clawhub.accounts.models import AuditLog, User
from clawhub.accounts.services import (
    email_verification_resend,
    password_reset_confirm,
    password_reset_request,
    user_email_verify,
    user_insert,
    user_login,
    user_password_change,
    user_signup,
    user_update,
)
from clawhub.core.exceptions import AuthenticationFailed, PermissionDenied, RateLimited, ValidationFailed
from clawhub.tenants.models import Tenant
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db
NEW_PASSWORD = "another-long-secret-42"


def _request(ip="10.1.1.1"):
    request = RequestFactory().post("/login/", REMOTE_ADDR=ip)
    SessionMiddleware(lambda r: None).process_request(request)
    return request


def _actions(user):
    return list(AuditLog.objects.filter(subject_user=user).values_list("action", flat=True))


# Sign-up ----------------------------------------------------------------------------------------------------

def test_signup_creates_user_tenant_hashed_password_and_audit_row(mailoutbox):
    user = user_signup(email=" New.Person@Example.COM ", password=PASSWORD, display_name=" Nina ",
                       ip="10.0.0.5")
    assert user.email == "new.person@example.com"
    assert user.display_name == "Nina"
    assert user.password != PASSWORD and PASSWORD not in user.password
    assert user.check_password(PASSWORD)
    assert Tenant.objects.filter(kind="user", user=user).exists()
    row = AuditLog.objects.get(action="user.signup")
    assert (row.actor, row.subject_user, row.ip) == (user, user, "10.0.0.5")
    assert mailoutbox == []  # verification is off by default


@pytest.mark.parametrize("password, fragment", [
    ("short1", "too short"),
    ("password123", "too common"),
    ("83749201837465", "entirely numeric"),
    ("newperson-example", "too similar"),
])
def test_signup_applies_django_password_validators_as_field_errors(password, fragment):
    with pytest.raises(ValidationFailed) as caught:
        user_signup(email="newperson@example.com", password=password)
    messages = caught.value.data["fields"]["password"]
    assert any(fragment in m for m in messages), messages
    assert not User.objects.filter(email="newperson@example.com").exists()


def test_signup_rejects_a_malformed_email():
    with pytest.raises(ValidationFailed) as caught:
        user_signup(email="not-an-address", password=PASSWORD)
    assert "email" in caught.value.data["fields"]


def test_signup_creates_nothing_for_a_taken_email_whatever_its_case(mailoutbox):
    make_user("taken@example.com")
    assert user_signup(email="TAKEN@example.com", password=PASSWORD) is None
    assert User.objects.filter(email__iexact="taken@example.com").count() == 1
    assert [m.to for m in mailoutbox] == [["taken@example.com"]]


def test_user_insert_gives_admin_made_users_a_tenant():
    user = user_insert(user=User(email="Admin.Made@Example.com"))
    assert user.email == "admin.made@example.com"
    assert user.tenant.kind == Tenant.Kind.USER


# Email verification -----------------------------------------------------------------------------------------

def test_signup_with_verification_sends_a_link_that_verifies(settings, mailoutbox, mail_link):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    user = user_signup(email="v@example.com", password=PASSWORD)
    assert user.email_verified_at is None
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["v@example.com"]
    token = mail_link(mailoutbox[0], "/verify-email/").split("/")[2]
    verified = user_email_verify(token=token)
    assert verified.pk == user.pk
    user.refresh_from_db()
    assert user.email_verified_at is not None
    assert "user.email_verify" in _actions(user)


def test_verification_token_is_rejected_when_tampered_expired_or_for_another_address(settings, mailoutbox,
                                                                                      mail_link):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    user = user_signup(email="v@example.com", password=PASSWORD)
    token = mail_link(mailoutbox[0], "/verify-email/").split("/")[2]
    with pytest.raises(ValidationFailed):
        user_email_verify(token=token[:-2] + "xx")
    user.email = "changed@example.com"
    user.save()
    with pytest.raises(ValidationFailed):
        user_email_verify(token=token)
    user.email = "v@example.com"
    user.save()
    settings.ACCOUNTS_EMAIL_VERIFICATION_TIMEOUT = -1
    with pytest.raises(ValidationFailed) as caught:
        user_email_verify(token=token)
    assert caught.value.code == "invalid_token"


def test_resend_mails_only_unverified_accounts(settings, mailoutbox):
    unverified = make_user("u@example.com")
    verified = make_user("ok@example.com")
    verified.email_verified_at = verified.date_joined
    verified.save()
    email_verification_resend(email="nobody@example.com")
    email_verification_resend(email="ok@example.com")
    assert mailoutbox == []
    email_verification_resend(email="U@example.com")
    assert [m.to for m in mailoutbox] == [[unverified.email]]


# Login ------------------------------------------------------------------------------------------------------

def test_login_starts_a_session_for_the_right_password():
    user = make_user("l@example.com")
    request = _request()
    assert user_login(request=request, email="L@example.com", password=PASSWORD) == (user, True)
    assert request.session["_auth_user_id"] == str(user.pk)
    # Only the first sign-in is one (the login page sends it to onboarding).
    assert user_login(request=_request(), email="l@example.com", password=PASSWORD) == (user, False)


def test_login_refuses_a_wrong_password_and_an_unknown_email_the_same_way():
    make_user("l@example.com")
    errors = []
    for email in ("l@example.com", "nobody@example.com"):
        with pytest.raises(AuthenticationFailed) as caught:
            user_login(request=_request(), email=email, password="wrong-password")
        errors.append((caught.value.code, caught.value.message))
    assert errors[0] == errors[1] == ("invalid_credentials", "Wrong email or password.")


def test_login_refuses_inactive_users():
    make_user("gone@example.com", is_active=False)
    with pytest.raises(AuthenticationFailed):
        user_login(request=_request(), email="gone@example.com", password=PASSWORD)


def test_login_lockout_refuses_the_right_password_and_is_audited(settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    user = make_user("l@example.com")
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            user_login(request=_request(), email="l@example.com", password="wrong-password")
    with pytest.raises(RateLimited) as caught:
        user_login(request=_request(), email="l@example.com", password=PASSWORD)
    assert 0 < caught.value.retry_after <= settings.LOGIN_FAILURE_WINDOW.total_seconds()
    lockouts = AuditLog.objects.filter(action="auth.lockout")
    assert {row.data["scope"] for row in lockouts} == {"account_ip"}
    assert lockouts.get(data__scope="account_ip").subject_user == user


def test_unverified_users_cannot_log_in_when_verification_is_required(settings):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    make_user("l@example.com")
    request = _request()
    with pytest.raises(AuthenticationFailed) as caught:
        user_login(request=request, email="l@example.com", password=PASSWORD)
    assert caught.value.code == "email_unverified"
    assert "_auth_user_id" not in request.session


# Passwords --------------------------------------------------------------------------------------------------

def test_password_change_needs_the_old_password_and_a_strong_new_one():
    user = make_user()
    with pytest.raises(PermissionDenied) as caught:
        user_password_change(user=user, old_password="wrong", new_password=NEW_PASSWORD)
    assert "old_password" in caught.value.data["fields"]
    with pytest.raises(ValidationFailed) as caught:
        user_password_change(user=user, old_password=PASSWORD, new_password="123")
    assert "new_password" in caught.value.data["fields"]
    user.refresh_from_db()
    assert user.check_password(PASSWORD)

    user_password_change(user=user, old_password=PASSWORD, new_password=NEW_PASSWORD, ip="10.0.0.7")
    user.refresh_from_db()
    assert user.check_password(NEW_PASSWORD)
    assert "user.password_change" in _actions(user)


def test_password_reset_link_sets_the_password_once(mailoutbox, mail_link):
    user = make_user("r@example.com")
    password_reset_request(email="R@example.com")
    assert len(mailoutbox) == 1
    _, _, uidb64, token, _ = mail_link(mailoutbox[0], "/password-reset/").split("/")
    password_reset_confirm(uidb64=uidb64, token=token, new_password=NEW_PASSWORD)
    user.refresh_from_db()
    assert user.check_password(NEW_PASSWORD)
    assert user.email_verified_at is not None  # following the link proved the mailbox
    assert {"user.password_reset_request", "user.password_reset"} <= set(_actions(user))
    with pytest.raises(ValidationFailed) as caught:
        password_reset_confirm(uidb64=uidb64, token=token, new_password="yet-another-secret-77")
    assert caught.value.code == "invalid_token"


def test_password_reset_for_an_unknown_or_inactive_address_sends_nothing(mailoutbox):
    make_user("gone@example.com", is_active=False)
    password_reset_request(email="nobody@example.com")
    password_reset_request(email="gone@example.com")
    assert mailoutbox == []


def test_password_reset_confirm_validates_the_new_password_and_the_uid():
    user = make_user()
    uidb64, token = urlsafe_base64_encode(force_bytes(user.pk)), default_token_generator.make_token(user)
    with pytest.raises(ValidationFailed) as caught:
        password_reset_confirm(uidb64=uidb64, token=token, new_password="short")
    assert "new_password" in caught.value.data["fields"]
    with pytest.raises(ValidationFailed):
        password_reset_confirm(uidb64="!!", token=token, new_password=NEW_PASSWORD)
    other = make_user()
    with pytest.raises(ValidationFailed):
        password_reset_confirm(uidb64=urlsafe_base64_encode(force_bytes(other.pk)), token=token,
                               new_password=NEW_PASSWORD)


def test_password_reset_lifts_the_login_lock(settings):
    settings.LOGIN_FAILURE_ACCOUNT_LIMIT = 2
    settings.LOGIN_FAILURE_WINDOW = timedelta(hours=1)
    user = make_user("r@example.com")
    for n in range(2):
        with pytest.raises(AuthenticationFailed):
            user_login(request=_request(ip=f"10.2.0.{n}"), email="r@example.com", password="nope")
    with pytest.raises(RateLimited):
        user_login(request=_request(ip="10.2.0.9"), email="r@example.com", password=PASSWORD)
    password_reset_confirm(uidb64=urlsafe_base64_encode(force_bytes(user.pk)),
                           token=default_token_generator.make_token(user), new_password=NEW_PASSWORD)
    signed_in, _first = user_login(request=_request(ip="10.2.0.9"), email="r@example.com",
                                   password=NEW_PASSWORD)
    assert signed_in == user


# Profile ----------------------------------------------------------------------------------------------------

def test_user_update_changes_the_display_name_and_audits_it():
    user = make_user(display_name="Old")
    user_update(user=user, actor=user, display_name="  New  ")
    user.refresh_from_db()
    assert user.display_name == "New"
    row = AuditLog.objects.get(action="user.update")
    assert row.data["display_name"] == {"old": "Old", "new": "New"}
    with pytest.raises(ValidationFailed):
        user_update(user=user, actor=user, display_name="x" * 151)
