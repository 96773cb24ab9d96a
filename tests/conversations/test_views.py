"""The conversations pages: own sessions only, and a conversation shown turn by turn."""

import pytest
from django.test import Client

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session
from tests.conversations.conftest import assistant, make_record, tool, tool_call, user
from tests.factories import make_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser():
    return Client(enforce_csrf_checks=True)


def test_list_and_detail(browser, key):
    calls = [tool_call("web_search", '{"q": "weather"}', "c1")]
    ask = make_record(key, [user("weather in Paris?")], reply=None, tool_calls=calls)
    result = make_record(key, [user("weather in Paris?"), assistant(None, calls), tool("Sunny, 21C", "c1")],
                         reply="It is sunny.")
    capture_store([ask, result, make_record(make_key()[0], [user("secret stuff")], session_id="other")])
    session = Session.objects.get(user=key.owner)
    browser.force_login(key.owner)

    listing = browser.get("/conversations/")
    assert listing.status_code == 200
    assert f'/conversations/{session.pk}/' in listing.text and "other" not in listing.text

    page = browser.get(f"/conversations/{session.pk}/")
    assert page.status_code == 200
    assert "weather in Paris?" in page.text and "web_search" in page.text
    assert "Sunny, 21C" in page.text and "It is sunny." in page.text  # next state and the reply after it
    other = Session.objects.get(external_id="other")
    assert browser.get(f"/conversations/{other.pk}/").status_code == 404


def test_pages_need_a_login(browser):
    response = browser.get("/conversations/")
    assert response.status_code == 302 and "/login" in response["Location"]
