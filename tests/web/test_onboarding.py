"""A new user in Debian's Chromium: sign up -> log in -> the "connect OpenClaw" page -> create the key -> copy
the config -> send a test request through the gateway (answered by the fake upstream) -> chat through the
openai SDK -> the checklist ticks itself (polling) for the first turn, its judgment and the first training
run."""

import json

import pytest

from clawhub.conversations.models import Turn
from clawhub.feedback.services import judgment_store
from clawhub.training.models import Backend, Method, TrainingRun
from clawhub.web import onboarding
from tests.gateway.conftest import wait_until
from tests.web.signup import sign_up

PASSWORD = "a-long-and-unusual-passphrase-7"
TICK_MS = 20_000  # capture and one poll; generous for a loaded 2-core machine, never part of what is measured


def _done(page, step: str):
    return page.locator(f"#step-{step}")


@pytest.mark.browser
def test_signup_onboarding_test_request_and_a_checklist_that_ticks(site, chromium, output_dir, monkeypatch,
                                                                   settings):
    monkeypatch.setattr(onboarding, "POLL_SECONDS", 1)
    settings.PUBLIC_BASE_URL = site.url
    context = chromium.new_context(viewport={"width": 1366, "height": 768})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url)
    page = context.new_page()
    from playwright.sync_api import expect

    sign_up(page, site.url, "grace@example.com", PASSWORD, screenshot=output_dir / "0-signed-up.png")
    expect(_done(page, "key")).to_have_attribute("data-done", "false")
    page.screenshot(path=str(output_dir / "1-onboarding.png"), full_page=True)

    page.click("#create-key")
    secret = page.inner_text("#key-secret").strip()
    assert secret.startswith("chk_")
    config = json.loads(page.inner_text("#openclaw-config"))
    provider = config["models"]["providers"]["clawhub"]
    assert provider["apiKey"] == secret and provider["baseUrl"] == f"{site.url}/v1"
    assert secret in page.inner_text("#openclaw-onboard")
    assert page.locator("button.copy").count() == 3
    page.click("button.copy[data-copy-target=openclaw-config]")
    expect(page.locator("button.copy[data-copy-target=openclaw-config]")).to_have_text("Copied")
    assert json.loads(page.evaluate("navigator.clipboard.readText()")) == config
    expect(_done(page, "key")).to_have_attribute("data-done", "true")
    assert "no-store" in page.request.get(f"{site.url}/onboarding/").headers["cache-control"]

    page.click("#test-request")
    answer = page.locator("#test-answer-text")
    expect(answer).to_be_visible(timeout=TICK_MS)
    assert answer.inner_text().strip()
    assert "clawhub-personal answered" in page.inner_text("#test-answer")
    expect(_done(page, "request")).to_have_attribute("data-done", "true", timeout=TICK_MS)
    page.screenshot(path=str(output_dir / "2-test-request-answered.png"), full_page=True)
    user_turns = Turn.objects.filter(user__email="grace@example.com")
    wait_until(lambda: user_turns.exists(), timeout=TICK_MS / 1000)
    # The test request is a side turn: logged, never trained on, and not the agent's "first turn".
    assert list(user_turns.values_list("turn_type", flat=True)) == ["side"]
    expect(_done(page, "turn")).to_have_attribute("data-done", "false")

    # The user's agent talks through the SDK with the key from the page; the second request is the first
    # turn's next state.
    site.agent_chat(secret, "rename notes.txt to todo.txt", "thanks, that worked")
    expect(_done(page, "turn")).to_have_attribute("data-done", "true", timeout=TICK_MS)
    page.screenshot(path=str(output_dir / "3-first-turn.png"), full_page=True)

    # What the judge and trainer workers write (they are tested in their own folders) ticks the last steps.
    first = wait_until(lambda: Turn.objects.filter(user__email="grace@example.com", turn_type="main",
                                                   next_state__isnull=False).first(), timeout=TICK_MS / 1000)
    judgment_store(turn=first, reward=1, votes=[1, 1, 1], hints=[], judge="rule", prompt_version="test",
                   raw_outputs={})
    expect(_done(page, "judgment")).to_have_attribute("data-done", "true", timeout=TICK_MS)
    TrainingRun.objects.create(tenant=first.tenant, backend=Backend.values[0], method=Method.values[0],
                               base_model="tiny")
    expect(_done(page, "training")).to_have_attribute("data-done", "true", timeout=TICK_MS)
    expect(page.locator(".checklist")).to_have_attribute("data-complete", "true")
    expect(page.locator("#checklist-done")).to_be_visible()
    page.screenshot(path=str(output_dir / "4-checklist-complete.png"), full_page=True)
    context.close()
