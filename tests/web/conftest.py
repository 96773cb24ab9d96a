"""Browser fixtures for the web pages: Debian's Chromium driven by Playwright (never a downloaded browser)."""

import os
from contextlib import contextmanager
from dataclasses import dataclass

import openai
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

    def agent_chat(self, secret: str, ask: str, thanks: str) -> None:
        """The user's agent talks through the openai SDK with the key ``secret``: ``ask``, then ``thanks``
        after the reply, so that the second request carries the first turn's next state."""
        client = openai.OpenAI(base_url=self.v1, api_key=secret, max_retries=0)
        history = [{"role": "user", "content": ask}]
        reply = client.chat.completions.create(model="clawhub-personal", messages=history)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": thanks}]
        client.chat.completions.create(model="clawhub-personal", messages=history)


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
