"""The playground page and the key it mints for the browser, through Django's test client (the browser test,
tests/web/test_layout_browser.py, asks both models through the gateway)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clawhub.keys.models import ApiKey
from clawhub.keys.selectors import key_resolve, keys_for_user
from tests.factories import add_member, make_group, make_user
from tests.gateway.conftest import activate_adapter

pytestmark = pytest.mark.django_db


def browser(user, **options) -> Client:
    client = Client(**options)
    client.force_login(user)
    return client


def test_the_page_offers_every_version_of_each_adapter_the_user_may_use():
    me = make_user()
    activate_adapter(me.tenant, version=1)
    activate_adapter(me.tenant, version=2)
    group = make_group(make_user(), name="Fruit lab")
    add_member(group, me)
    viewed = make_group(make_user(), name="Only watching")
    from clawhub.groups.models import Role

    add_member(viewed, me, role=Role.VIEWER)
    page = browser(me).get("/playground/")
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("clawhub-personal: the active version (v2)", 'value="clawhub-personal:v1"',
                 'value="clawhub-personal:v2"', f'value="clawhub-group-{group.slug}"', "no version yet"):
        assert text in html, text
    assert "only-watching" not in html  # a viewer sends no requests to a group's adapter
    assert "chk_" not in html  # no secret in the page: the script asks for one
    assert Client().get("/playground/").status_code == 302


def test_the_key_is_minted_for_the_session_short_lived_hidden_and_one_at_a_time():
    me = make_user()
    strict = browser(me, enforce_csrf_checks=True)
    assert strict.post("/playground/key/").status_code == 403  # no CSRF token: another site cannot mint one
    assert browser(me).get("/playground/key/").status_code == 405
    assert Client().post("/playground/key/").status_code == 302

    first = browser(me).post("/playground/key/")
    assert first.status_code == 200
    assert "no-store" in first["Cache-Control"]
    secret = first.json()["key"]
    resolved = key_resolve(secret=secret)
    assert resolved.key.playground and resolved.key.scopes == ["inference"]
    assert resolved.key.expires_at - timezone.now() <= timedelta(hours=1)
    assert not ApiKey.objects.filter(pk=resolved.key.pk, secrets__digest=secret).exists()  # a digest only
    assert list(keys_for_user(user=me)) == []
    assert resolved.key.prefix not in browser(me).get("/keys/").content.decode()
    # Not on the key pages, so it cannot be rotated into a lasting key.
    assert browser(me).get(f"/keys/{resolved.key.pk}/").status_code == 404

    second = browser(me).post("/playground/key/").json()["key"]
    assert key_resolve(secret=secret) is None and key_resolve(secret=second) is not None

    group = make_group(make_user())
    assert browser(me).post("/playground/key/", {"group": group.slug}).status_code == 404  # not a member
    add_member(group, me)
    for_group = browser(me).post("/playground/key/", {"group": group.slug}).json()["key"]
    assert key_resolve(secret=for_group).tenant == group.tenant
    assert key_resolve(secret=second) is not None  # each adapter's key lives on its own


def test_a_playground_turn_is_rated_on_its_conversation_page_and_only_then_becomes_a_sample():
    from clawhub.review.models import Sample
    from tests.review.conftest import make_turn

    me = make_user()
    turn = make_turn(me, turn_type="playground", next_text=None)
    page = browser(me).get(f"/conversations/{turn.session_id}/").content.decode()
    assert "never judged: a playground turn trains only if you rate it" in page
    assert f'action="/conversations/turns/{turn.pk}/feedback/"' in page
    assert not Sample.objects.filter(turn=turn).exists()
    assert browser(me).post(f"/conversations/turns/{turn.pk}/feedback/", {"thumb": "up"}).status_code == 302
    assert Sample.objects.get(turn=turn).reward == 1
