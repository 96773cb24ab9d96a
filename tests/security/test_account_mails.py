"""Sign-up does not tell who has an account: a taken address gets the answer a new one gets, with email
verification on or off, on the page and in the API (nobody is signed in by sign-up; the taken address's owner
gets a mail). Reset and verification mails are rate-limited per address and per IP (the answer stays the
same; the mails stop)."""

import re

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.hashers import get_hasher
from django.test import Client
from rest_framework.test import APIClient

from clawhub.accounts.models import User
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db


def api():
    return APIClient()  # the test client skips CSRF; these endpoints are anonymous


TAKEN, FRESH = "someone@example.com", "nobody@example.com"
CHOSEN = "what-an-attacker-might-type-71"  # the password typed into the sign-up form
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')


def _page_signup(email: str):
    """POST /signup/ as a browser does: a fresh client that holds the form's CSRF cookie and token."""
    client = Client(enforce_csrf_checks=True)
    client.get("/signup/")
    token = client.cookies[django_settings.CSRF_COOKIE_NAME].value
    response = client.post("/signup/", {"email": email, "new_password1": CHOSEN, "new_password2": CHOSEN,
                                        "csrfmiddlewaretoken": token})
    # The page repeats the address it was given (the login form's prefill): compare it as a placeholder.
    body = CSRF_FIELD.sub("CSRF", response.content.decode()).replace(email, "ADDRESS")
    return client, response, body


def _api_signup(email: str):
    """POST /api/auth/signup/ as a script does: GET /api/auth/csrf/, then the token as X-CSRFToken."""
    client = APIClient(enforce_csrf_checks=True)
    token = client.get("/api/auth/csrf/").json()["csrf_token"]
    response = client.post("/api/auth/signup/", {"email": email, "password": CHOSEN}, format="json",
                           HTTP_X_CSRFTOKEN=token)
    body = {k: v for k, v in response.json().items() if k != "csrf_token"}
    return client, response, body


def _answer(response, body) -> dict:
    """What a caller sees of a sign-up, CSRF tokens (random per response) left out."""
    cookies = {name: morsel.value for name, morsel in response.cookies.items()
               if name != django_settings.CSRF_COOKIE_NAME}
    return {"status": response.status_code, "location": response.get("Location"), "body": body,
            "cookies": cookies, "cookie_names": sorted(response.cookies)}


@pytest.mark.parametrize("verification", [False, True], ids=["verification-off", "verification-on"])
@pytest.mark.parametrize("signup", [_page_signup, _api_signup], ids=["page", "api"])
def test_signup_answers_a_taken_address_exactly_like_a_new_one(settings, mailoutbox, verification, signup):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = verification
    owner = make_user(TAKEN)
    taken_client, taken, taken_body = signup(TAKEN)
    fresh_client, fresh, fresh_body = signup(FRESH)

    assert taken.status_code in (200, 201)
    assert _answer(taken, taken_body) == _answer(fresh, fresh_body)
    session = settings.SESSION_COOKIE_NAME
    assert session not in taken.cookies and session not in fresh.cookies
    for client in (taken_client, fresh_client):  # nobody was signed in
        assert client.get("/api/me/").status_code in (401, 403)
    assert "already exists" not in str(taken_body) and "email_taken" not in str(taken_body)

    # The owner of the taken address is told someone tried; their account is as it was.
    to_owner = [m for m in mailoutbox if m.to == [TAKEN]]
    assert len(to_owner) == 1 and "already has one" in to_owner[0].body
    owner.refresh_from_db()
    assert owner.check_password(PASSWORD) and not owner.check_password(CHOSEN)
    assert User.objects.filter(email=FRESH).exists()
    # The new address gets its confirmation link only where the site asks for one.
    assert [m.to for m in mailoutbox if m.to != [TAKEN]] == ([[FRESH]] if verification else [])


def test_sign_up_costs_one_password_hash_whether_the_address_is_new_or_taken(monkeypatch):
    hasher = type(get_hasher())
    hashed = []
    encode = hasher.encode
    monkeypatch.setattr(hasher, "encode", lambda self, *a, **kw: hashed.append(1) or encode(self, *a, **kw))
    make_user(TAKEN)
    hashed.clear()
    api().post("/api/auth/signup/", {"email": TAKEN, "password": CHOSEN}, format="json")
    assert len(hashed) == 1
    api().post("/api/auth/signup/", {"email": FRESH, "password": CHOSEN}, format="json")
    assert len(hashed) == 2


def test_a_new_account_signs_in_after_sign_up_and_starts_on_onboarding(settings):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = False
    client, _response, _body = _page_signup(FRESH)
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    first = client.post("/login/", {"email": FRESH, "password": CHOSEN, "csrfmiddlewaretoken": token})
    assert first.status_code == 302 and first["Location"] == "/onboarding/"
    assert client.get("/onboarding/").status_code == 200


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
