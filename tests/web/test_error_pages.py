"""The pages a browser reaches without a route: a styled 404 inside the site's frame with a way home, and
/favicon.ico, which every browser asks for, answered instead of a 404 on every page."""

import pytest
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.test import Client

from tests.factories import make_user

pytestmark = pytest.mark.django_db


def test_an_unknown_page_is_a_404_in_the_sites_frame_with_a_link_home():
    response = Client().get("/no-such-page/")
    page = response.content.decode()
    assert response.status_code == 404
    assert "clawhub/site.css" in page and 'class="topbar"' in page and 'id="not-found"' in page
    assert "/no-such-page/" in page and 'href="/"' in page and "Go to the home page" in page

    client = Client()
    client.force_login(make_user())
    page = client.get("/keys/999999/").content.decode()  # someone else's or no key: the same page
    assert 'id="not-found"' in page and "Back to the dashboard" in page and "Log out" in page


def test_an_unknown_api_url_still_answers_json():
    response = Client().get("/api/no-such-endpoint/")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_favicon_ico_sends_the_browser_to_the_sites_icon():
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == static("clawhub/favicon.svg")
    assert finders.find("clawhub/favicon.svg")
    page = Client().get("/login/").content.decode()
    assert f'rel="icon" href="{static("clawhub/favicon.svg")}"' in page
