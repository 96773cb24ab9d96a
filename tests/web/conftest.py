"""Browser fixtures for the web pages: Debian's Chromium driven by Playwright (never a downloaded browser)."""

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# A laptop screen: what the pages must be readable on.
LAPTOP = {"width": 1366, "height": 768}


@pytest.fixture
def chromium():
    # Playwright's sync API runs an event loop in this thread; only the servers' threads use the ORM.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def laptop_page(chromium):
    context = chromium.new_context(viewport=LAPTOP)
    page = context.new_page()
    yield page
    context.close()
