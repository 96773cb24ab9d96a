"""The usage page: the user's own tables, and group sections only for the group's owners and admins."""

import pytest
from django.test import Client

from clawhub.groups.models import Role
from clawhub.usage.services import usage_record
from tests.conversations.conftest import make_record, user
from tests.factories import add_member, make_group, make_key

pytestmark = pytest.mark.django_db


def test_usage_page(db):
    group = make_group()
    owner = group.created_by
    member = add_member(group, role=Role.MEMBER)
    usage_record(
        records=[
            make_record(
                make_key(member, name="laptop")[0], [user("x")], prompt_tokens=1234, completion_tokens=66
            ),
            make_record(
                make_key(member, name="group key", group=group)[0],
                [user("y")],
                prompt_tokens=10,
                completion_tokens=1,
            ),
        ]
    )
    browser = Client(enforce_csrf_checks=True)

    browser.force_login(member)
    page = browser.get("/usage/")
    assert page.status_code == 200
    assert "laptop" in page.text and "1311" in page.text  # the member's own total tokens
    assert f'id="group-{group.slug}"' not in page.text  # members get no group section
    assert "format=csv" in page.text

    browser.force_login(owner)
    page = browser.get("/usage/")
    assert f'id="group-{group.slug}"' in page.text and member.email in page.text
    assert "laptop" not in page.text  # the member's personal key is not the group's
    section = page.text[page.text.index(f'id="group-{group.slug}"'):]
    assert "<title" in section and "Requests per member</title>" in section  # a chart, not escaped text
    assert f'data-series="answered" data-category="{member.email}" data-value="1"' in section

    assert browser.get("/usage/?since=not-a-date").status_code == 200


def test_usage_page_needs_a_login():
    response = Client().get("/usage/")
    assert response.status_code == 302
