"""The usage page in a browser: for known usage, each chart draws the bars it should (series, category,
value), with its title and axis names, above the table; screenshots on a laptop-sized window."""

from datetime import UTC, datetime, timedelta

import pytest

from clawhub.usage.services import usage_record
from tests.conversations.conftest import make_record, user
from tests.factories import PASSWORD, make_key, make_user

TODAY = datetime.now(tz=UTC).replace(hour=12, minute=0, second=0, microsecond=0)

BARS_JS = """(title) => {
  const svg = [...document.querySelectorAll('svg.chart')]
    .find(s => s.querySelector('title').textContent === title);
  if (!svg) return null;
  return {
    bars: [...svg.querySelectorAll('rect.bar')]
      .map(r => [r.dataset.category, r.dataset.series, +r.dataset.value]),
    axes: [...svg.querySelectorAll('text.axis-label')].map(t => t.textContent),
    width: svg.getBoundingClientRect().width,
  };
}"""


def _day(days_ago: int) -> str:
    return (TODAY - timedelta(days=days_ago)).date().isoformat()


@pytest.fixture
def usage_world(transactional_db):
    ada = make_user("ada@example.com")
    laptop = make_key(ada, name="laptop")[0]
    ci = make_key(ada, name="ci runner")[0]

    def at(key, days_ago, prompt, completion, **fields):
        return make_record(key, [user("hi")], started_at=(TODAY - timedelta(days=days_ago)).timestamp(),
                           prompt_tokens=prompt, completion_tokens=completion, **fields)

    usage_record(records=[
        at(laptop, 0, 100, 10), at(laptop, 0, 200, 20), at(laptop, 0, 50, 0, status="failed"),
        at(ci, 2, 1000, 400), at(ci, 2, 10, 1, status="failed"),
    ])
    return {"ada": ada, "laptop": laptop, "ci": ci}


@pytest.mark.browser
def test_usage_charts_draw_the_known_usage(live_server, laptop_page, usage_world, output_dir):
    page = laptop_page
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=email]", "ada@example.com")
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{live_server.url}/onboarding/")  # ada's first sign-in: "connect OpenClaw"
    page.goto(f"{live_server.url}/usage/")

    titles = page.eval_on_selector_all("svg.chart > title", "ts => ts.map(t => t.textContent)")
    assert titles == ["Requests per day", "Tokens per day", "Requests per model", "Tokens per model",
                      "Requests per key", "Tokens per key"]

    per_day = page.evaluate(BARS_JS, "Requests per day")
    assert sorted(per_day["bars"]) == sorted([
        [_day(0), "answered", 2], [_day(0), "errors", 1], [_day(2), "answered", 1], [_day(2), "errors", 1],
    ])
    assert per_day["axes"] == ["day (UTC)", "requests"]
    tokens = page.evaluate(BARS_JS, "Tokens per day")
    assert sorted(tokens["bars"]) == sorted([
        [_day(0), "prompt", 350], [_day(0), "completion", 30], [_day(2), "prompt", 1010],
        [_day(2), "completion", 401],
    ])
    laptop, ci = usage_world["laptop"], usage_world["ci"]
    per_key = page.evaluate(BARS_JS, "Tokens per key")
    assert sorted(per_key["bars"]) == sorted([
        [f"laptop …{laptop.last4}", "prompt", 350], [f"laptop …{laptop.last4}", "completion", 30],
        [f"ci runner …{ci.last4}", "prompt", 1010], [f"ci runner …{ci.last4}", "completion", 401],
    ])
    assert per_key["axes"] == ["tokens", "key"]
    # Readable on a laptop: two charts side by side, each still wider than a phone.
    assert per_day["width"] > 380
    # The tables stay, under the charts.
    assert page.evaluate("""() => !!(document.querySelector('svg.chart').compareDocumentPosition(
        document.querySelector('table.usage')) & Node.DOCUMENT_POSITION_FOLLOWING)""")
    assert _day(2) in page.inner_text("table.usage >> nth=0")
    page.screenshot(path=str(output_dir / "usage-charts.png"), full_page=True)
    page.locator("svg.chart").nth(0).screenshot(path=str(output_dir / "requests-per-day.png"))
    page.locator("svg.chart").nth(4).screenshot(path=str(output_dir / "requests-per-key.png"))
    # A narrow window stacks the charts, one per row, without a horizontal scrollbar.
    page.set_viewport_size({"width": 700, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate(BARS_JS, "Tokens per day")["width"] > 500
    page.screenshot(path=str(output_dir / "usage-charts-narrow.png"), full_page=True)
