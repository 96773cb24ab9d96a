"""The onboarding pages without a browser: login, the key made by the POST, the secret kept nowhere but that
response, and a checklist that reads only the viewer's own tenant."""

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


def test_the_post_creates_a_personal_key_and_shows_its_secret_only_in_that_response():
    person = make_user()
    browser = Client(enforce_csrf_checks=False)
    browser.force_login(person)
    assert b'id="create-key"' in browser.get("/onboarding/").content
    response = browser.post("/onboarding/")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    key = ApiKey.objects.get(owner=person)
    assert key.group_id is None and key.name == "OpenClaw"
    secret = response.context["secret"]
    assert secret.startswith("chk_") and secret in response.text
    assert 'data-model="clawhub-personal"' in response.text
    assert secret not in str(dict(browser.session))
    again = browser.get("/onboarding/")
    assert secret not in again.text and "You already have 1 key" in again.text


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
