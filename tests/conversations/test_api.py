"""REST API for a user's sessions and turns: own only, main/side filters, key and session auth."""

import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session
from tests.conversations.conftest import assistant, make_record, user
from tests.factories import make_key, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversations(key):
    """Two sessions of ``key``'s owner (one with a side turn) and one session of someone else."""
    first = make_record(key, [user("hi")], reply="hello", token_ids=[1, 2], logprobs=[-0.5, -0.1])
    second = make_record(key, [user("hi"), assistant("hello"), user("thanks")])
    heartbeat = make_record(key, [user("Read HEARTBEAT.md")], reply="HEARTBEAT_OK", session_id="hb")
    stranger = make_record(make_key()[0], [user("mine")], session_id="theirs")
    capture_store([first, second, heartbeat, stranger])
    return {"main": Session.objects.get(turns__request_id=first.request_id), "side": Session.objects.get(
        external_id="hb"), "theirs": Session.objects.get(external_id="theirs"), "first": first}


def test_list_shows_own_sessions_with_counts_and_filters(api_client, key, conversations):
    api_client.force_login(key.owner)
    body = api_client.get("/api/sessions/").json()
    assert body["count"] == 2
    by_id = {s["id"]: s for s in body["results"]}
    assert set(by_id) == {conversations["main"].pk, conversations["side"].pk}
    main = by_id[conversations["main"].pk]
    assert (main["main_turns"], main["side_turns"], main["turn_count"]) == (2, 0, 2)
    assert main["inferred"] is True and main["model"] == "clawhub-personal" and main["key"] == key.pk

    only_side = api_client.get("/api/sessions/?type=side").json()
    assert [s["id"] for s in only_side["results"]] == [conversations["side"].pk]
    only_main = api_client.get("/api/sessions/?type=main").json()
    assert [s["id"] for s in only_main["results"]] == [conversations["main"].pk]
    assert api_client.get("/api/sessions/?limit=1").json()["next"] is not None
    bad = api_client.get("/api/sessions/?type=weird")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"


def test_list_searches_words_and_filters_by_key_and_day(api_client, key, conversations):
    from django.utils import timezone

    api_client.force_login(key.owner)

    def ids(query: str) -> set[int]:
        response = api_client.get(f"/api/sessions/?{query}")
        assert response.status_code == 200, response.content
        return {s["id"] for s in response.json()["results"]}

    main, side = conversations["main"].pk, conversations["side"].pk
    assert ids("q=THANKS") == {main}  # a message, any case; never another user's ("mine")
    assert ids("q=heartbeat_ok") == {side}  # a reply
    assert ids("q=mine") == set()
    assert ids(f"key={key.pk}") == {main, side} and ids(f"key={make_key()[0].pk}") == set()
    today = timezone.localdate().isoformat()
    assert ids(f"since={today}&until={today}") == {main, side}
    assert ids("until=2001-01-01") == set() and ids("until=9999-12-31") == {main, side}
    assert api_client.get("/api/sessions/").json()["results"][0]["playground_turns"] == 0
    assert api_client.get("/api/sessions/?since=yesterday").status_code == 400


def test_detail_shows_turns_in_order_with_next_state(api_client, key, conversations):
    api_client.force_login(key.owner)
    body = api_client.get(f"/api/sessions/{conversations['main'].pk}/").json()
    turns = body["turns"]
    assert [t["index"] for t in turns] == [0, 1]
    assert turns[0]["request_id"] == conversations["first"].request_id
    assert turns[0]["next_state"] == [user("thanks")]
    assert turns[0]["response"][0]["message"]["content"] == "hello"
    assert "token_ids" not in turns[0] and "logprobs" not in turns[0]
    # Which adapter answered is the user's to see: the record's upstream model and adapter version.
    assert turns[0]["upstream_model"] == conversations["first"].upstream_model
    assert turns[0]["adapter_version_id"] == conversations["first"].adapter_version_id
    side = api_client.get(f"/api/sessions/{conversations['side'].pk}/?type=main").json()
    assert side["turns"] == []


def test_another_users_session_is_not_found(api_client, key, conversations):
    api_client.force_login(key.owner)
    response = api_client.get(f"/api/sessions/{conversations['theirs'].pk}/")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    staff = make_user(is_staff=True)
    api_client.force_login(staff)
    assert api_client.get("/api/sessions/").json()["count"] == 0  # review of others' data is not this API


def test_api_key_auth_and_anonymous(api_client, conversations):
    owner = conversations["main"].user
    _, plain = make_key(owner)
    # Conversations are what a stolen agent key would be used to read: only a read-scoped key may.
    assert api_client.get("/api/sessions/", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 403
    _, secret = make_key(owner, scopes=["read"])
    response = api_client.get("/api/sessions/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200 and response.json()["count"] == 2
    anonymous = api_client.get("/api/sessions/", HTTP_AUTHORIZATION="")
    assert anonymous.status_code in (401, 403) and "error" in anonymous.json()
