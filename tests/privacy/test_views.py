"""The privacy page, as a browser uses it (CSRF on): the switches, withdrawing a sample, the export and
deleting the account."""

import json

import pytest

from clawhub.accounts.models import User
from tests.factories import PASSWORD, make_user
from tests.review.conftest import make_sample, old_key

pytestmark = pytest.mark.django_db


def test_privacy_page_switches_and_sample_deletion(browser_as):
    user = make_user()
    key = old_key(user, name="laptop")
    sample = make_sample(user, key=key)
    browser = browser_as(user)
    html = browser.get("/privacy/").content.decode()
    assert "laptop" in html and "Delete my account" in html
    assert f"/privacy/samples/{sample.pk}/delete/" in html
    browser.post("/privacy/switches/", {"store_turns": "on"})  # training box left unticked
    user.refresh_from_db()
    assert (user.store_turns, user.training_enabled) == (True, False)
    browser.post(f"/privacy/keys/{key.pk}/", {})
    key.refresh_from_db()
    assert key.training_enabled is False
    # Deleting asks first: a post without the confirmation (the old one-click button) changes nothing.
    response = browser.post(f"/privacy/samples/{sample.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == f"/privacy/samples/{sample.pk}/delete/"
    sample.refresh_from_db()
    assert sample.state != "deleted"
    confirm = browser.get(response["Location"]).content.decode()
    assert f"Delete sample #{sample.pk}?" in confirm and 'name="confirm" value="yes"' in confirm
    browser.post(f"/privacy/samples/{sample.pk}/delete/", {"confirm": "yes"})
    sample.refresh_from_db()
    assert sample.state == "deleted"
    stranger_sample = make_sample(make_user(), key=None)
    stranger_url = f"/privacy/samples/{stranger_sample.pk}/delete/"
    assert browser.get(stranger_url).status_code == 404 and browser.post(stranger_url).status_code == 404
    assert browser.post(stranger_url, {"confirm": "yes"}).status_code == 404


def test_export_download(browser_as):
    user = make_user()
    make_sample(user, key=old_key(user), prompt="my own words")
    response = browser_as(user).get("/privacy/export/")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    data = json.loads(response.content)
    assert data["profile"]["email"] == user.email and "my own words" in response.content.decode()


def test_delete_account_from_the_page(browser_as):
    user = make_user()
    browser = browser_as(user)
    response = browser.post("/privacy/delete-account/", {"password": "nope"})
    assert response["Location"] == "/privacy/" and User.objects.filter(pk=user.pk).exists()
    response = browser.post("/privacy/delete-account/", {"password": PASSWORD})
    assert response.status_code == 302 and not User.objects.filter(pk=user.pk).exists()
    assert browser.get("/privacy/").status_code == 302  # logged out


def test_the_privacy_page_leads_to_the_password_page(browser_as):
    user = make_user()
    browser = browser_as(user)
    html = browser.get("/privacy/").content.decode()
    assert 'href="/account/password/" id="password-change-link"' in html and user.email in html
    page = browser.get("/account/password/").content.decode()
    assert "Change your password" in page and "Sign out everywhere" in page
