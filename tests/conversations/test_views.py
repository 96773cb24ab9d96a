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


def test_the_list_searches_text_filters_by_key_type_and_day_and_previews_each_first_message(browser, key):
    from datetime import timedelta

    from django.utils import timezone

    laptop = make_key(key.owner, name="laptop")[0]
    capture_store([
        make_record(key, [user("Which fruit is cheapest in March?")], reply="Apples.", session_id="fruit"),
        make_record(key, [user("Plan a trip to Lyon")], reply="Take the TGV at dawn.", session_id="trip"),
        make_record(laptop, [user("Summarise the meeting notes")], reply="Three.", session_id="notes"),
        make_record(make_key()[0], [user("cheapest fruit of someone else")], session_id="stranger"),
    ])
    ids = dict(Session.objects.values_list("external_id", "pk"))
    ten_days_ago = timezone.now() - timedelta(days=10)
    Session.objects.filter(external_id="trip").update(started_at=ten_days_ago, last_activity_at=ten_days_ago)
    browser.force_login(key.owner)

    def listed(**query) -> set[str]:
        html = browser.get("/conversations/", query).text
        return {name for name in ids if f"/conversations/{ids[name]}/" in html}

    everything = browser.get("/conversations/").text
    assert "Which fruit is cheapest in March?" in everything  # the preview of the first message
    assert listed() == {"fruit", "trip", "notes"}
    assert listed(q="CHEAPEST") == {"fruit"}  # any case, and never another user's
    assert listed(q="tgv") == {"trip"}  # the reply is searched too
    assert listed(key=laptop.pk) == {"notes"}
    assert listed(to=timezone.localdate(ten_days_ago).isoformat()) == {"trip"}
    assert listed(**{"from": timezone.localdate().isoformat()}) == {"fruit", "notes"}
    assert listed(type="playground") == set()
    assert "No conversation matches these filters" in browser.get("/conversations/", {"q": "zebra"}).text
    assert listed(key="not-a-key", to="not-a-day") == {"fruit", "trip", "notes"}  # nonsense is ignored
    assert listed(to="9999-12-31", q="fruit\x00") == {"fruit"}  # no overflow, no NUL sent to the database
