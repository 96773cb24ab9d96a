"""Groups test fixtures: a group with a person in every role, and signed-in CSRF-enforcing clients."""

from dataclasses import dataclass

import pytest
from django.conf import settings
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client
from rest_framework.test import APIClient

from clawhub.accounts.models import User
from clawhub.groups.models import Group, Role
from clawhub.groups.services import invitation_create
from tests.factories import add_member, make_group, make_user


def signed_in(client, user: User):
    """Signs ``user`` in on a CSRF-enforcing client and gives it a CSRF cookie plus the matching X-CSRFToken
    header, as a browser page (or a script that read the cookie) would send them."""
    client.force_login(user)
    token = _get_new_csrf_string()
    client.cookies[settings.CSRF_COOKIE_NAME] = token
    client.defaults["HTTP_X_CSRFTOKEN"] = token
    return client


def token_of(link: str) -> str:
    """The token at the end of an invitation link (…/invitations/<token>/)."""
    return link.rstrip("/").rsplit("/", 1)[1]


@dataclass
class Crew:
    group: Group
    owner: User
    admin: User
    admin2: User
    member: User
    target: User  # a plain member the others act on
    viewer: User
    outsider: User  # owns another group, is not in this one

    def as_role(self, name: str) -> User:
        return getattr(self, name)


@pytest.fixture
def crew(db) -> Crew:
    owner = make_user(email="owner@example.com")
    group = make_group(owner, name="Crew")
    outsider = make_user(email="outsider@example.com")
    make_group(outsider, name="Elsewhere")
    return Crew(
        group=group,
        owner=owner,
        admin=add_member(group, make_user(email="admin@example.com"), Role.ADMIN),
        admin2=add_member(group, make_user(email="admin2@example.com"), Role.ADMIN),
        member=add_member(group, make_user(email="member@example.com"), Role.MEMBER),
        target=add_member(group, make_user(email="target@example.com"), Role.MEMBER),
        viewer=add_member(group, make_user(email="viewer@example.com"), Role.VIEWER),
        outsider=outsider,
    )


@pytest.fixture
def link_invitation(crew):
    """A link-only member invitation to the crew's group: (invitation, token)."""
    invitation, link = invitation_create(actor=crew.owner, group=crew.group)
    return invitation, token_of(link)


def _clients_as(client_class):
    def make(user: User | None):
        client = client_class(enforce_csrf_checks=True)
        return signed_in(client, user) if user is not None else client
    return make


@pytest.fixture
def api_as():
    """api_as(user) -> a signed-in CSRF-enforcing APIClient; api_as(None) -> an anonymous one."""
    return _clients_as(APIClient)


@pytest.fixture
def web_as():
    """web_as(user) -> the same with Django's page Client."""
    return _clients_as(Client)
