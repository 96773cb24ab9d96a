"""The onboarding pages without a browser: login, the key made by the POST, its secret shown once on the page
the POST redirects to (a reload makes no second key), and a checklist that reads only the viewer's own
tenant."""

import pytest
from django.test import Client

from clawhub.keys.models import ApiKey
from clawhub.usage.services import usage_record
from clawhub.web.checklist import onboarding_checklist
from tests.conversations.conftest import make_record, user
from tests.factories import make_group, make_key, make_user

pytestmark = pytest.mark.django_db


def _steps(person) -> dict[str, bool]:
    return {s.slug: s.done for s in onboarding_checklist(user=person).steps}


def test_pages_need_a_login():
    for url in ("/onboarding/", "/onboarding/checklist/"):
        assert Client().get(url)["Location"].startswith("/login/?next=")


def test_the_post_creates_a_personal_key_and_a_reload_makes_no_second_one():
    person = make_user()
    browser = Client(enforce_csrf_checks=False)
    browser.force_login(person)
    assert b'id="create-key"' in browser.get("/onboarding/").content
    response = browser.post("/onboarding/")
    key = ApiKey.objects.get(owner=person)
    assert key.group_id is None and key.name == "OpenClaw"
    assert response.status_code == 302 and response["Location"] == f"/onboarding/?key={key.pk}"

    shown = browser.get(response["Location"])
    assert shown.status_code == 200 and shown["Cache-Control"] == "no-store"
    secret = shown.context["secret"]
    assert secret.startswith("chk_") and secret in shown.text
    assert 'data-model="clawhub-personal"' in shown.text
    assert secret not in str(dict(browser.session))

    reloaded = browser.get(response["Location"], follow=True)  # what the reload button does
    assert ApiKey.objects.filter(owner=person).count() == 1
    assert secret not in reloaded.text and "was shown once" in reloaded.text
    assert "You already have 1 key" in reloaded.text
    assert secret not in browser.get("/onboarding/").text


def test_the_secret_page_takes_only_the_viewers_own_key():
    person = make_user()
    browser = Client()
    browser.force_login(person)
    others = make_key(make_user())[0]
    for bad in (str(others.pk), "x", "-1", "9" * 30):
        assert browser.get("/onboarding/", {"key": bad}).status_code == 404


def test_the_checklist_follows_the_tenant_and_no_one_elses():
    person, other = make_user(), make_user()
    assert _steps(person) == dict.fromkeys(("key", "request", "turn", "judgment", "training"), False)
    group = make_group(person)
    make_key(person, group=group)
    assert _steps(person)["key"] is False  # a group key is not the personal key onboarding asks for
    key = make_key(person)[0]
    usage_record(records=[make_record(key, [user("hi")])])
    assert _steps(person) == {"key": True, "request": True, "turn": False, "judgment": False,
                                   "training": False}
    make_key(other)  # the other user has a key, and none of the person's requests
    browser = Client()
    browser.force_login(other)
    fragment = browser.get("/onboarding/checklist/")
    assert fragment.status_code == 200 and fragment["Cache-Control"] == "no-store"
    assert fragment.text.count('data-done="false"') == 4 and 'id="step-key"' in fragment.text
