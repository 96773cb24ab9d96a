"""Every main page of a signed-in user's console in Debian's Chromium, on a phone (390 px) and on a laptop
(1280 px): the page never scrolls sideways (wide tables scroll inside their own box), the navigation stays on
screen, no chart is cut off, and the browser logs no error. A screenshot of each page at each width is left
in test-output/. A rating's answer is in view after the page scrolls back to the rated turn. /api/docs/ draws
the API reference with nothing from outside. A run's page, open while the run finishes, takes its Cancel
button away. And the playground asks the base model and a version of the adapter through the gateway. The
module's tests share one Chromium, each page gets a context of its own."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clawhub.adapters import services as adapter_services
from clawhub.adapters.evaluation import PROMOTE, Decision
from clawhub.review.models import Sample
from clawhub.training import services as training
from clawhub.training import views as training_views
from clawhub.training.lineage_services import adapter_record_decision
from clawhub.training.models import TrainingRun
from clawhub.usage.models import UsageDaily
from tests.factories import make_group, make_run, make_user
from tests.review.conftest import make_sample, old_key
from tests.web.conftest import chromium_browser

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def chromium():
    with chromium_browser() as browser:
        yield browser


def a_used_account():
    """A user with a key, judged turns in several states, a promoted version from a finished run, and a group:
    what makes each page show its tables instead of its empty states. Returns the user, a conversation whose
    reply can still be rated, and the pages."""
    me = make_user("layout-tester-with-a-long-address@example.com")
    key = old_key(me, name="laptop agent with a long descriptive name")
    long_prompt = "Please list every fruit in the basket with its price per kilogram " * 4
    samples = [make_sample(me, key=key, reward=reward, prompt=long_prompt, hints=hints)
               for reward, hints in ((1, []), (-1, ["Say which fruit is cheapest first."]), (1, []), (0, []))]
    steps = [{"step": s, "loss": 0.6 / s, "mean_reward": r, "mean_advantage": r, "samples": 2, "tokens": 90,
              "seconds": 1.5} for s, r in ((1, -0.5), (2, 0.0), (3, 0.5), (4, 1.0))]
    run = make_run(me.tenant, state=TrainingRun.State.SUCCEEDED, started_by=me, metrics=steps,
                   sample_ids=[s.pk for s in samples[:2]], finished_at=timezone.now())
    version = adapter_services.adapter_version_create(tenant=me.tenant, parent=None)
    run.adapter_version = version
    run.save(update_fields=["adapter_version"])
    adapter_record_decision(version=version, decision=Decision(
        PROMOTE, "margin +0.220", {"confidence": 0.9, "held_out": 12,
                                   "margin": {"delta": 0.22, "low": 0.18, "high": 0.27}}))
    adapter_services.adapter_activate(version=version, upstreams=[])
    trained = Sample.objects.filter(pk__in=[s.pk for s in samples[:2]])
    trained.update(training_run=run, trained_at=timezone.now())
    make_sample(me, key=key, reward=1, votes=[1, -1, 1], prompt=long_prompt)  # split votes: waits for review
    group = make_group(me, name="Fruit lab with a rather long group name")
    key.last_used_at = timezone.now()
    key.save(update_fields=["last_used_at"])
    for days_ago, model in ((0, "clawhub-personal"), (1, "base"), (3, "clawhub-personal")):  # usage to chart
        UsageDaily.objects.create(day=timezone.now().date() - timedelta(days=days_ago), key=key, user=me,
                                  tenant=me.tenant, model=model, requests=40 + days_ago, errors=days_ago,
                                  prompt_tokens=52_000 * (days_ago + 1), completion_tokens=7_300,
                                  latency_ms_sum=41_000.0, streams=40, ttft_ms_sum=9_000.0)
    unrated = f"/conversations/{samples[2].turn.session_id}/"  # not trained yet: it can still be rated
    return me, unrated, {
        "dashboard": "/dashboard/",
        "keys": "/keys/",
        "key": f"/keys/{key.pk}/",
        "conversations": "/conversations/",
        "playground": "/playground/",
        "conversation": f"/conversations/{samples[1].turn.session_id}/",
        "review": "/review/",
        "review-sample": f"/review/{samples[1].pk}/",
        "training": f"/training/{me.tenant.pk}/",
        "run": f"/training/runs/{run.pk}/",
        "learning": f"/learning/{me.tenant.pk}/",
        "usage": "/usage/",
        "groups": "/groups/",
        "group": f"/groups/{group.slug}/",
        "group-delete": f"/groups/{group.slug}/delete/",
        "privacy": "/privacy/",
        "audit": "/audit/",
        "account": "/account/",
        "password": "/account/password/",
        "onboarding": "/onboarding/",
        "not-found": "/no-such-page/",
    }


# The innermost elements that reach past the right edge: what a failure should point at.
PAST_THE_EDGE = """() => [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth
                 && ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth))
    .slice(0, 5).map(e => [e.tagName.toLowerCase(), e.getAttribute('class')].filter(Boolean).join('.'))"""


def session_cookie(user, url: str) -> dict:
    client = Client()
    client.force_login(user)
    return {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": url}


def visit(chromium, url: str, cookie: dict, viewport: dict, screenshot) -> list[str]:
    """What is wrong with the page at this width: sideways scroll, navigation off screen, browser errors, a
    request the page made (its icon, styles, scripts) that failed."""
    context = chromium.new_context(viewport=viewport)
    context.add_cookies([cookie])
    page = context.new_page()
    errors = []

    def on_console(message):  # the page's own status is checked below; a failed part of it is an error
        own_status = message.text.startswith("Failed to load resource") and message.location.get("url") == url
        if message.type == "error" and not own_status:
            errors.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda r: r.status >= 400 and r.url != url and errors.append(f"{r.status} {r.url}"))
    response = page.goto(url)
    expected = 404 if url.endswith("/no-such-page/") else 200
    problems = [f"HTTP {response.status}"] if response.status != expected else []
    if page.evaluate("getComputedStyle(document.querySelector('.brand')).fontWeight") != "700":
        problems.append("not styled by the site's stylesheet")
    problems += [f"console: {e}" for e in errors]
    scroll = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if scroll[0] > scroll[1]:
        problems.append(f"scrolls sideways: {scroll[0]} px wide in {scroll[1]} px, "
                        f"past the edge: {page.evaluate(PAST_THE_EDGE)}")
    off_screen = page.evaluate("""() => [...document.querySelectorAll('header a, header button')]
        .filter(e => { const r = e.getBoundingClientRect();
                       return r.right > window.innerWidth || r.left < 0; })
        .map(e => e.textContent.trim())""")
    if off_screen:
        problems.append(f"navigation off screen: {off_screen}")
    cut_charts = page.evaluate("""() => [...document.querySelectorAll('.chart-box svg')]
        .filter(s => s.getBoundingClientRect().width > s.parentElement.clientWidth + 1).length""")
    if cut_charts:
        problems.append(f"{cut_charts} chart(s) wider than their box, cut off")
    page.screenshot(path=str(screenshot), full_page=True)
    context.close()
    return problems


def rate_on_a_phone(chromium, url: str, cookie: dict, output_dir) -> None:
    """Rates the conversation's first reply: the page comes back scrolled to that turn (#turn-N), and the
    answer must be on screen there, not at the top of the page, above the viewport."""
    context = chromium.new_context(viewport=PHONE)
    context.add_cookies([cookie])
    page = context.new_page()
    page.goto(url)
    turn = page.locator("article.turn").first
    turn.locator("details.rate summary").click()
    with page.expect_navigation():
        turn.get_by_role("button", name="Good (thumbs up)").click()
    page.wait_for_load_state()
    shown = page.evaluate("""() => {
        const m = [...document.querySelectorAll('.messages li')]
            .find(li => li.textContent.includes('your feedback is recorded'));
        if (!m) return null;
        const r = m.getBoundingClientRect();
        return {top: r.top, bottom: r.bottom, height: window.innerHeight, scrolled: window.scrollY};
    }""")
    page.screenshot(path=str(output_dir / "rated-phone.png"))
    context.close()
    assert shown is not None, "no message after rating"
    assert shown["scrolled"] > 0, f"the page did not scroll to the rated turn: {shown}"
    assert 0 <= shown["top"] and shown["bottom"] <= shown["height"], f"the message is off screen: {shown}"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_every_main_page_fits_a_phone_and_a_laptop(live_server, chromium, output_dir):
    me, unrated, pages = a_used_account()
    cookie = session_cookie(me, live_server.url)
    problems = {}
    for width, viewport in (("phone", PHONE), ("laptop", DESKTOP)):
        for name, path in pages.items():
            shot = output_dir / f"{name}-{width}.png"
            found = visit(chromium, live_server.url + path, cookie, viewport, shot)
            if found:
                problems[f"{path} at {viewport['width']} px"] = found
    assert problems == {}
    rate_on_a_phone(chromium, live_server.url + unrated, cookie, output_dir)

    context = chromium.new_context(viewport=DESKTOP)  # the promoted version against the base, in words
    context.add_cookies([cookie])
    page = context.new_page()
    page.goto(f"{live_server.url}{pages['learning']}")
    card = page.locator("#base-vs-version")
    assert card.locator("h2").inner_text() == "v1 against the base model"
    assert "a clear gain" in card.inner_text()
    card.screenshot(path=str(output_dir / "learning-base-vs-version.png"))
    context.close()

    context = chromium.new_context()  # what a browser that asks for /favicon.ico gets
    icon = context.new_page().goto(f"{live_server.url}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    context.close()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_run_page_stops_offering_cancel_once_the_run_has_succeeded(live_server, chromium, monkeypatch):
    from playwright.sync_api import expect

    monkeypatch.setattr(training_views, "POLL_SECONDS", 0.3)
    me = make_user()
    run = make_run(me.tenant, state=TrainingRun.State.RUNNING, started_by=me)
    context = chromium.new_context(viewport=PHONE)
    context.add_cookies([session_cookie(me, live_server.url)])
    page = context.new_page()
    page.goto(f"{live_server.url}/training/runs/{run.pk}/")
    expect(page.locator("#cancel-form")).to_be_visible()
    training.run_succeed(run_id=run.pk, metrics=[], trained_sample_ids=[], dropped=[], resumed_from_step=None)
    expect(page.locator("#cancel-form")).to_be_hidden(timeout=10_000)  # the page's poller saw the run finish
    expect(page.locator(".run-live [data-field=state]")).to_have_text("succeeded")
    context.close()


@pytest.mark.browser
def test_the_api_reference_draws_offline(live_server, chromium):
    """Redoc, its script and the schema all come from this server (the browser here reaches nothing else):
    the page draws the operations, and nothing it asks for fails. No database: the page and the schema read
    none."""
    context = chromium.new_context(viewport=DESKTOP)
    page = context.new_page()
    failed = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    page.on("pageerror", lambda error: failed.append(str(error)))
    page.goto(f"{live_server.url}/api/docs/")
    page.get_by_role("heading", name="ClawHub API").first.wait_for(timeout=20_000)
    assert page.locator("[data-section-id^='operation/']").count() > 10
    context.close()
    # Redoc's own attribution image is the one thing it takes from outside; it hides it when it fails.
    assert [url for url in failed if url != "https://cdn.redoc.ly/redoc/logo-mini.svg"] == []


@pytest.mark.browser
def test_the_playground_answers_with_the_base_model_and_a_version_of_the_adapter(site, chromium, output_dir):
    """Through the gateway in front of the fake upstream, which answers with the name it was asked for: the
    base's ("tiny") or the adapter's on vLLM ("t<tenant>-v<N>"). Both turns are stored as playground turns;
    only the one rated on the page becomes a training sample."""
    from playwright.sync_api import expect

    from clawhub.conversations.models import Turn
    from tests.gateway.conftest import activate_adapter, wait_until

    me = make_user()
    activate_adapter(me.tenant, version=1)
    activate_adapter(me.tenant, version=2)
    context = chromium.new_context(viewport=PHONE)
    context.add_cookies([session_cookie(me, site.url)])
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{site.url}/playground/")
    page.select_option("#pg-model", "clawhub-personal:v1")  # the retired version, not the active one
    page.fill("#pg-prompt", "Which fruit is cheapest?")
    page.fill("#pg-max", "12")
    page.get_by_role("button", name="Ask both").click()
    base, adapter = page.locator("#answer-base blockquote"), page.locator("#answer-adapter blockquote")
    expect(base).to_contain_text("tiny says hello", timeout=20_000)
    expect(adapter).to_contain_text(f"t{me.tenant.pk}-v1 says hello", timeout=20_000)
    page.locator("#answer-adapter").get_by_role("button", name="Good (thumbs up)").click()
    expect(page.locator("#answer-adapter .rated")).to_contain_text("now a training sample", timeout=20_000)
    page.screenshot(path=str(output_dir / "playground-answered-phone.png"), full_page=True)
    context.close()
    assert errors == []

    stored = Turn.objects.filter(user=me).order_by("model")
    turns = wait_until(lambda: stored.count() == 2 and list(stored))
    assert [(t.model, t.turn_type) for t in turns] == [("base", "playground"),
                                                       ("clawhub-personal:v1", "playground")]
    assert [t.model for t in turns if hasattr(t, "sample")] == ["clawhub-personal:v1"]
