"""Drives the real web UI in Debian's headless Chromium: sign up, log in, create a key, see the OpenClaw
block, reload it (still one key), revoke the key through its confirmation page, log out."""

import json
import os

import pytest

from clawhub.keys.models import ApiKey
from tests.web.signup import sign_up

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def page(output_dir):
    # Playwright's sync API runs an event loop in this thread; only the live server's thread uses the ORM.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        yield page
        browser.close()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_signup_create_key_see_openclaw_block_logout(live_server, page, output_dir, settings):
    settings.PUBLIC_BASE_URL = "https://hub.example.com"
    sign_up(page, live_server.url, "ada@example.com", "a-long-and-unusual-passphrase-7",
            screenshot=output_dir / "signed-up.png")

    page.goto(f"{live_server.url}/keys/")
    page.fill("form.key-form input[name=name]", "laptop agent")
    page.click("form.key-form button[type=submit]")

    secret = page.inner_text("#key-secret").strip()
    assert secret.startswith("chk_")
    config = json.loads(page.inner_text("#openclaw-config"))
    provider = config["models"]["providers"]["clawhub"]
    assert provider["baseUrl"] == "https://hub.example.com/v1"
    assert provider["apiKey"] == secret
    assert [m["id"] for m in provider["models"]][0] == "clawhub-personal"
    assert secret in page.inner_text("#openclaw-onboard")
    # The secret page is reached by a redirect and has copy buttons, as onboarding does.
    assert page.url.endswith("/secret/")
    assert page.locator("button.copy").count() == 3
    page.screenshot(path=str(output_dir / "openclaw-block.png"), full_page=True)

    # A reload makes no second key and no longer shows the secret.
    page.reload()
    assert page.locator("#key-secret").count() == 0 and secret not in page.content()
    assert "shown once" in page.inner_text("main")
    [key] = ApiKey.objects.all()
    assert page.url == f"{live_server.url}/keys/{key.pk}/"
    page.screenshot(path=str(output_dir / "after-reload.png"), full_page=True)

    # Revoking asks first, on a page of its own.
    page.click("#revoke-link")
    page.wait_for_url(f"{live_server.url}/keys/{key.pk}/revoke/")
    page.screenshot(path=str(output_dir / "revoke-confirm.png"), full_page=True)
    key.refresh_from_db()
    assert key.revoked_at is None
    page.click("#confirm-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/keys/{key.pk}/")
    assert "revoked" in page.inner_text("main")
    key.refresh_from_db()
    assert key.revoked_at is not None

    page.click("nav button:has-text('Log out')")
    page.wait_for_url(f"{live_server.url}/login/**")
    page.goto(f"{live_server.url}/keys/")
    assert "/login/" in page.url  # the key pages need a session again
