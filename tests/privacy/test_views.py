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
    browser.post(f"/privacy/samples/{sample.pk}/delete/")
    sample.refresh_from_db()
    assert sample.state == "deleted"
    stranger_sample = make_sample(make_user(), key=None)
    assert browser.post(f"/privacy/samples/{stranger_sample.pk}/delete/").status_code == 404


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
