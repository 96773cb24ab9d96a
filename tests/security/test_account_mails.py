"""Finding 9: sign-up does not tell who has an account, and reset/verification mails are rate-limited per
address and per IP (the answer stays the same; the mails stop)."""

import pytest
from rest_framework.test import APIClient

from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db


def api():
    return APIClient()  # the test client skips CSRF; these endpoints are anonymous


def test_signup_for_a_taken_address_is_answered_like_any_other(settings, mailoutbox):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    make_user("someone@example.com")
    taken = api().post("/api/auth/signup/", {"email": "someone@example.com", "password": PASSWORD},
                       format="json")
    fresh = api().post("/api/auth/signup/", {"email": "nobody@example.com", "password": PASSWORD},
                       format="json")
    assert taken.status_code == fresh.status_code == 201
    strip = {"csrf_token"}
    assert {k: v for k, v in taken.json().items() if k not in strip} == \
        {k: v for k, v in fresh.json().items() if k not in strip}
    assert "email_taken" not in taken.content.decode()


def test_reset_mails_stop_after_the_per_address_limit(settings, mailoutbox):
    settings.ACCOUNT_MAIL_PER_ADDRESS = 2
    make_user("victim@example.com")
    answers = [api().post("/api/auth/password/reset/", {"email": "victim@example.com"}, format="json",
                          REMOTE_ADDR=f"10.1.0.{i}") for i in range(5)]
    assert {r.status_code for r in answers} == {202}
    assert len({r.content for r in answers}) == 1  # the same answer throughout
    assert len(mailoutbox) == 2


def test_mails_stop_after_the_per_ip_limit_across_addresses(settings, mailoutbox):
    settings.ACCOUNT_MAIL_PER_IP = 3
    for i in range(6):
        make_user(f"u{i}@example.com", email_verified_at=None)
    for i in range(6):
        assert api().post("/api/auth/verify-email/resend/", {"email": f"u{i}@example.com"}, format="json",
                          REMOTE_ADDR="10.2.0.1").status_code == 202
    assert len(mailoutbox) == 3
    # Another address still gets its mail.
    api().post("/api/auth/verify-email/resend/", {"email": "u5@example.com"}, format="json",
               REMOTE_ADDR="10.2.0.2")
    assert len(mailoutbox) == 4
