"""Browser fixtures for the web pages: Debian's Chromium driven by Playwright (never a downloaded browser)."""

import os
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from django.conf import settings

from clawhub.gateway.app import Gateway
from clawhub.gateway.config import GatewayConfig
from tests.gateway.conftest import fake, fake_upstream, serve_asgi  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# A laptop screen: what the pages must be readable on.
LAPTOP = {"width": 1366, "height": 768}


@contextmanager
def chromium_browser():
    """Debian's Chromium, headless, for as long as the block runs."""
    # Playwright's sync API runs an event loop in this thread; only the servers' threads use the ORM.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def chromium():
    with chromium_browser() as browser:
        yield browser


@pytest.fixture
def laptop_page(chromium):
    context = chromium.new_context(viewport=LAPTOP)
    page = context.new_page()
    yield page
    context.close()


@dataclass
class Site:
    """The whole web process as ``./dev run`` serves it (Django pages and static files, and /v1 on the same
    origin) over real HTTP, with the gateway in front of the fake upstream and capture writing to the test
    database."""

    url: str
    gateway: Gateway

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


@pytest.fixture
def site(transactional_db, fake):  # noqa: F811
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.core.asgi import get_asgi_application

    config = GatewayConfig.from_settings(
        upstreams=[{"url": fake.url, "base_model": "tiny", "max_adapters": 8, "api_key": ""}],
        health_interval=0.5, redis_url=settings.REDIS_URL)
    gateway = Gateway(config)  # no store: the real capture path (hand-off, in-process consumer, database)
    django_app = ASGIStaticFilesHandler(get_asgi_application())

    async def app(scope, receive, send):  # the routing of clawhub/asgi.py, around this test's gateway
        path = scope.get("path", "")
        if scope["type"] == "lifespan" or path == "/v1" or path.startswith("/v1/"):
            await gateway(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    url, server, thread = serve_asgi(app)
    yield Site(url, gateway)
    server.should_exit = True
    thread.join(20)
