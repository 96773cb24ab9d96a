import pytest
from django.conf import settings
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_key, make_user


def arm_csrf(client):
    """Gives a CSRF-enforcing client a valid CSRF cookie and header, as a browser has after loading a form."""
    token = _get_new_csrf_string()
    client.cookies[settings.CSRF_COOKIE_NAME] = token
    client.defaults["HTTP_X_CSRFTOKEN"] = token
    return client


def login(client, user):
    """Signs ``user`` in on a CSRF-enforcing client and arms it with a valid CSRF token."""
    client.force_login(user)
    return arm_csrf(client)


@pytest.fixture
def client_settings(settings):
    """The site URL and model limits that the client configurations (Claude Code, Codex, OpenClaw) print."""
    settings.PUBLIC_BASE_URL = "https://hub.example.org/"
    settings.MODEL_CONTEXT_WINDOW = 65536
    settings.MODEL_MAX_TOKENS = 4096
    return settings


@pytest.fixture
def own_key_page(client, db) -> str:
    """The page of a new personal key, as its owner sees it."""
    user = make_user()
    key, _ = make_key(user)
    client.force_login(user)
    return client.get(f"/keys/{key.pk}/").content.decode()


@pytest.fixture
def web_client():
    return Client(enforce_csrf_checks=True)


@pytest.fixture
def cast(db):
    """One group with a person in every role, a key owner who is a plain member, and an outsider who owns
    another group. The key owner has one key bound to the group and one personal key."""
    group_owner = make_user(email="owner@example.com")
    group = make_group(group_owner, name="Crew")
    people = {
        "group_owner": group_owner,
        "group_admin": add_member(group, make_user(email="admin@example.com"), Role.ADMIN),
        "group_member": add_member(group, make_user(email="member@example.com"), Role.MEMBER),
        "group_viewer": add_member(group, make_user(email="viewer@example.com"), Role.VIEWER),
        "key_owner": add_member(group, make_user(email="keyowner@example.com"), Role.MEMBER),
    }
    other_owner = make_user(email="other@example.com")
    people["other_owner"] = other_owner
    other_group = make_group(other_owner, name="Elsewhere")
    group_key, group_secret = make_key(people["key_owner"], name="crew key", group=group)
    personal_key, personal_secret = make_key(people["key_owner"], name="my key")
    return {
        "group": group,
        "other_group": other_group,
        "people": people,
        "keys": {"group": (group_key, group_secret), "personal": (personal_key, personal_secret)},
    }
