import re
from datetime import timedelta

import pytest
from django.test import Client

from clawhub.accounts.models import User
from clawhub.accounts.services import audit_record
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db
NEW_PASSWORD = "another-long-secret-42"


def _logged_in(browser) -> bool:
    return browser.get("/dashboard/").status_code == 200


# CSRF -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, data", [
    ("/login/", {"email": "c@example.com", "password": PASSWORD}),
    ("/signup/", {"email": "n@example.com", "new_password1": PASSWORD, "new_password2": PASSWORD}),
    ("/password-reset/", {"email": "c@example.com"}),
    ("/logout/", {}),
])
def test_forms_refuse_a_post_without_csrf_token(url, data, mailoutbox):
    make_user("c@example.com")
    client = Client(enforce_csrf_checks=True)
    client.get("/login/")  # holds the cookie, but the form field is missing
    assert client.post(url, data).status_code == 403
    assert client.get("/dashboard/").status_code == 302
    assert not User.objects.filter(email="n@example.com").exists()
    assert mailoutbox == []


# Sign-up ----------------------------------------------------------------------------------------------------

def test_signup_page_answers_with_the_login_form_and_the_first_sign_in_goes_to_onboarding(browser):
    page = browser.get("/signup/")
    assert page.status_code == 200 and b'name="csrfmiddlewaretoken"' in page.content
    response = browser.post("/signup/", {"email": "New@Example.com", "display_name": "Nina",
                                         "new_password1": PASSWORD, "new_password2": PASSWORD})
    # Not signed in: the login form, its address filled in (sign-up answers every address this way).
    assert response.status_code == 200 and b'id="signed-up"' in response.content
    assert b'action="/login/"' in response.content and b'value="new@example.com"' in response.content
    assert not _logged_in(browser)
    assert User.objects.get(email="new@example.com").display_name == "Nina"
    response = browser.login("new@example.com", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/onboarding/"  # connect OpenClaw first
    assert _logged_in(browser)


def test_signup_shows_field_errors(browser, mailoutbox):
    response = browser.post("/signup/", {"email": "n@example.com", "new_password1": PASSWORD,
                                         "new_password2": PASSWORD + "x"})
    assert response.status_code == 200 and b"do not match" in response.content
    response = browser.post("/signup/", {"email": "n@example.com", "new_password1": "12345",
                                         "new_password2": "12345"})
    assert b"too short" in response.content
    make_user("taken@example.com")
    response = browser.post("/signup/", {"email": "taken@example.com", "new_password1": PASSWORD,
                                         "new_password2": PASSWORD})
    assert b'id="signed-up"' in response.content and b"already exists" not in response.content
    assert not _logged_in(browser)
    assert [m.to for m in mailoutbox] == [["taken@example.com"]]


# Login and logout -------------------------------------------------------------------------------------------

def test_login_and_logout(browser):
    make_user("l@example.com")
    response = browser.login("l@example.com", "wrong-password")
    assert response.status_code == 200 and b"Wrong email or password." in response.content
    response = browser.login("l@example.com", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/onboarding/"  # the first sign-in
    assert _logged_in(browser)
    assert browser.get("/logout/").status_code == 405  # logging out is a POST, never a link
    response = browser.post("/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"
    assert not _logged_in(browser)
    response = browser.login("l@example.com", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/dashboard/"  # every later one


def test_login_follows_a_local_next_but_not_an_external_one(browser):
    make_user("l@example.com")
    response = browser.post("/login/", {"email": "l@example.com", "password": PASSWORD, "next": "/keys/"})
    assert response["Location"] == "/keys/"
    browser.post("/logout/")
    response = browser.post("/login/", {"email": "l@example.com", "password": PASSWORD,
                                        "next": "https://evil.example/"})
    assert response["Location"] == "/dashboard/"


def test_login_page_throttles_with_a_clear_error(browser, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_WINDOW = timedelta(minutes=10)
    make_user("victim@example.com")
    for _ in range(3):
        browser.login("victim@example.com", "guess")
    response = browser.login("victim@example.com", PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed login attempts. Try again in 10 minutes." in response.content
    assert 0 < int(response["Retry-After"]) <= 600
    assert not _logged_in(browser)


# Passwords --------------------------------------------------------------------------------------------------

def test_password_change_page(browser):
    assert browser.get("/account/password/")["Location"].startswith("/login/?next=")
    make_user("p@example.com")
    browser.login("p@example.com", PASSWORD)
    response = browser.post("/account/password/", {"old_password": "wrong", "new_password1": NEW_PASSWORD,
                                                   "new_password2": NEW_PASSWORD})
    assert response.status_code == 200 and b"The current password is wrong." in response.content
    response = browser.post("/account/password/", {"old_password": PASSWORD, "new_password1": NEW_PASSWORD,
                                                   "new_password2": NEW_PASSWORD})
    assert response.status_code == 302
    assert _logged_in(browser)  # the session that changed the password survives
    browser.post("/logout/")
    assert browser.login("p@example.com", NEW_PASSWORD).status_code == 302


def test_password_reset_pages(browser, mailoutbox, mail_link):
    user = make_user("r@example.com")
    for email in ("nobody@example.com", "r@example.com"):
        response = browser.post("/password-reset/", {"email": email}, follow=True)
        assert b"If an account exists for this address" in response.content
    assert [m.to for m in mailoutbox] == [["r@example.com"]]
    link = mail_link(mailoutbox[0], "/password-reset/")
    page = browser.get(link)
    assert page.status_code == 200 and b"new_password1" in page.content
    response = browser.post(link, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/login/"
    user.refresh_from_db()
    assert user.check_password(NEW_PASSWORD)
    assert browser.get(link).status_code == 400  # used links are dead
    assert browser.get("/password-reset/MQ/bad-token/").status_code == 400


# Email verification -----------------------------------------------------------------------------------------

def test_verification_pages(browser, settings, mailoutbox, mail_link):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    response = browser.post("/signup/", {"email": "v@example.com", "new_password1": PASSWORD,
                                         "new_password2": PASSWORD})
    assert response.status_code == 200 and b"Check your inbox" in response.content
    assert not _logged_in(browser)

    response = browser.login("v@example.com", PASSWORD)
    assert b"Confirm your email address before logging in" in response.content
    assert b'action="/verify-email/resend/"' in response.content
    assert browser.post("/verify-email/resend/", {"email": "v@example.com"}).status_code == 302
    assert len(mailoutbox) == 2

    assert browser.get("/verify-email/not-a-token/").status_code == 400
    response = browser.get(mail_link(mailoutbox[1], "/verify-email/"))
    assert response.status_code == 302 and response["Location"] == "/login/"
    # The first sign-in of the new account, now confirmed: "connect OpenClaw".
    assert browser.login("v@example.com", PASSWORD)["Location"] == "/onboarding/"


def test_where_the_person_was_going_survives_sign_up_the_mailed_link_and_log_in(browser, settings, mailoutbox,
                                                                                 mail_link):
    settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = True
    going = "/invitations/some-token/"
    response = browser.post(f"/signup/?next={going}", {"email": "w@example.com", "new_password1": PASSWORD,
                                                       "new_password2": PASSWORD})
    assert b"Check your inbox" in response.content and f'/login/?next={going}"'.encode() in response.content
    assert f'name="next" value="{going}"'.encode() in response.content  # "send the link again" keeps it too
    link = mail_link(mailoutbox[0], "/verify-email/")
    assert link.endswith("?next=%2Finvitations%2Fsome-token%2F")
    response = browser.get(link)
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=%2Finvitations%2Fsome-token%2F"
    response = browser.post("/login/", {"email": "w@example.com", "password": PASSWORD, "next": going})
    assert response["Location"] == going
    # Another site is never a destination.
    assert b"evil" not in browser.get("/signup/?next=https://evil.example/").content


# Audit ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("role, status", [
    ("owner", 200), ("admin", 200), ("staff", 200), ("member", 403), ("viewer", 403), ("outsider", 404),
])
def test_audit_page_group_filter_by_role(browser, roles, role, status):
    group = roles["group"]
    browser.login(roles[role].email, PASSWORD)
    response = browser.get(f"/audit/?group={group.slug}")
    assert response.status_code == status
    if status == 200:
        assert b"group.create" in response.content


def test_audit_page_lists_own_rows_and_offers_only_readable_groups(browser, roles):
    owner, member, group = roles["owner"], roles["member"], roles["group"]
    audit_record(actor=owner, action="test.to_member", target=member, subject_user=member)
    browser.login(member.email, PASSWORD)
    page = browser.get("/audit/")
    assert page.status_code == 200
    assert b"test.to_member" in page.content and b"group.create" not in page.content
    assert f'value="{group.slug}"'.encode() not in page.content
    browser.post("/logout/")
    browser.login(owner.email, PASSWORD)
    assert f'value="{group.slug}"'.encode() in browser.get("/audit/").content


def test_audit_page_everything_is_for_staff(browser, roles):
    audit_record(actor=roles["owner"], action="test.elsewhere", target=roles["owner"])
    browser.login(roles["outsider"].email, PASSWORD)
    assert b"test.elsewhere" not in browser.get("/audit/?all=1").content
    browser.post("/logout/")
    browser.login(roles["staff"].email, PASSWORD)
    assert b"test.elsewhere" in browser.get("/audit/?all=1").content


# The account page ------------------------------------------------------------------------------------------

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:140.0) Gecko/20100101 Firefox/140.0"
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
          "Version/18.0 Mobile/15E148 Safari/604.1")


def test_log_ins_and_failed_attempts_are_in_the_audit_log_and_on_the_account_page(browser):
    from clawhub.accounts.models import AuditLog

    user = make_user("s@example.com")
    assert browser.get("/account/")["Location"].startswith("/login/?next=")
    browser.login("s@example.com", "wrong-password", HTTP_USER_AGENT=IPHONE)
    browser.login("nobody@example.com", "wrong-password")
    browser.login("s@example.com", PASSWORD, HTTP_USER_AGENT=FIREFOX)
    rows = list(AuditLog.objects.filter(action__startswith="auth.").order_by("id"))
    assert [(r.action, r.subject_user_id, r.actor_id, r.data.get("reason")) for r in rows] == [
        ("auth.login_failed", user.pk, None, "wrong_password"),
        ("auth.login_failed", None, None, "wrong_password"),  # no such account: for staff only
        ("auth.login", user.pk, user.pk, None),
    ]
    assert rows[1].data["email"] == "nobody@example.com" and rows[0].data["email"] == ""
    assert rows[2].data["user_agent"] == FIREFOX and rows[2].ip == "127.0.0.1"
    page = browser.get("/account/").content.decode()
    assert "s@example.com" in page and 'href="/account/password/"' in page
    sign_ins = page[page.index('id="sign-ins"'):]
    assert sign_ins.index("Signed in") < sign_ins.index("Wrong password")  # newest first
    assert "Firefox on Linux" in sign_ins and "Safari on iPhone" in sign_ins
    assert "nobody@example.com" not in page
    audit = browser.get("/audit/").content.decode()
    assert "auth.login" in audit and "auth.login_failed" in audit


def test_the_account_page_lists_sessions_and_signs_one_or_all_out(browser):
    make_user("m@example.com")
    phone = Client(enforce_csrf_checks=True, HTTP_USER_AGENT=IPHONE)
    phone.get("/login/")
    phone.post("/login/", {"email": "m@example.com", "password": PASSWORD,
                           "csrfmiddlewaretoken": phone.cookies["csrftoken"].value})
    assert phone.get("/dashboard/").status_code == 200
    browser.login("m@example.com", PASSWORD, HTTP_USER_AGENT=FIREFOX)
    page = browser.get("/account/", HTTP_USER_AGENT=FIREFOX).content.decode()
    sessions = page[page.index('id="sessions"'):page.index('id="sign-ins"')]
    assert "Safari on iPhone" in sessions and "Firefox on Linux" in sessions
    assert sessions.count("this browser") == 1 and sessions.count(">Sign out</button>") == 1
    end = re.search(r'action="(/account/sessions/\d+/end/)"', sessions).group(1)
    assert browser.post(end)["Location"] == "/account/"
    assert phone.get("/dashboard/").status_code == 302  # the phone is signed out
    page = browser.get("/account/").content.decode()
    assert "Safari on iPhone" not in page[page.index('id="sessions"'):page.index('id="sign-ins"')]
    assert _logged_in(browser)

    phone.get("/login/")
    phone.post("/login/", {"email": "m@example.com", "password": PASSWORD,
                           "csrfmiddlewaretoken": phone.cookies["csrftoken"].value})
    assert browser.post("/logout/everywhere/")["Location"] == "/login/"
    assert not _logged_in(browser) and phone.get("/dashboard/").status_code == 302
    browser.login("m@example.com", PASSWORD)
    page = browser.get("/account/").content.decode()
    sessions = page[page.index('id="sessions"'):page.index('id="sign-ins"')]
    assert sessions.count("this browser") == 1 and "Sign out</button>" not in sessions


def test_the_account_page_saves_the_name(browser):
    make_user("n@example.com")
    browser.login("n@example.com", PASSWORD)
    assert browser.post("/account/", {"display_name": "Ada"})["Location"] == "/account/"
    assert User.objects.get(email="n@example.com").display_name == "Ada"
    assert b'value="Ada"' in browser.get("/account/").content
