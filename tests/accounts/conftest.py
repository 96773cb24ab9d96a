"""Clients that behave like a browser: they hold the CSRF cookie and send its token with every write."""

import re

import pytest
from django.test import Client


def _csrf_cookie(client, priming_url: str) -> str:
    if "csrftoken" not in client.cookies:
        client.get(priming_url)
    return client.cookies["csrftoken"].value


class BrowserApi:
    """A script talking to /api/ the way the docs tell it to: GET /api/auth/csrf/ once, then X-CSRFToken."""

    def __init__(self, client):
        self.client = client

    def get(self, url, **extra):
        return self.client.get(url, **extra)

    def post(self, url, data=None, **extra):
        token = _csrf_cookie(self.client, "/api/auth/csrf/")
        return self.client.post(url, data or {}, format="json", HTTP_X_CSRFTOKEN=token, **extra)

    def patch(self, url, data=None, **extra):
        token = _csrf_cookie(self.client, "/api/auth/csrf/")
        return self.client.patch(url, data or {}, format="json", HTTP_X_CSRFTOKEN=token, **extra)

    def login(self, email, password, **extra):
        return self.post("/api/auth/login/", {"email": email, "password": password}, **extra)


class Browser:
    """Django's test client with CSRF checks on; posts carry the token a rendered form would carry."""

    def __init__(self):
        self.client = Client(enforce_csrf_checks=True)

    def get(self, url, **extra):
        return self.client.get(url, **extra)

    def post(self, url, data=None, **extra):
        token = _csrf_cookie(self.client, "/login/")
        return self.client.post(url, {**(data or {}), "csrfmiddlewaretoken": token}, **extra)

    def login(self, email, password, **extra):
        return self.post("/login/", {"email": email, "password": password}, **extra)


@pytest.fixture
def api(api_client):
    return BrowserApi(api_client)


@pytest.fixture
def browser():
    return Browser()


@pytest.fixture
def mail_link():
    """Finds the path of the link in an email that starts with a given prefix, as a reader would click it."""

    def find(message, path_prefix: str) -> str:
        match = re.search(r"https?://[^/\s]+(" + re.escape(path_prefix) + r"\S*)", message.body)
        assert match, f"no {path_prefix} link in: {message.body}"
        return match.group(1)

    return find


@pytest.fixture
def roles(every_role):
    """The group with one user of each role (tests/conftest.py), its outsider named ``outsider``."""
    return {("outsider" if name == "other" else name): value for name, value in every_role.items()
            if name != "tenant"}
