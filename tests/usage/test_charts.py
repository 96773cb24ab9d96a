"""clawhub/usage/charts.py: the usage page's charts from summary rows."""

from datetime import date

from clawhub.usage.charts import MAX_ROWS, row_label, usage_charts


def _row(**fields):
    return {"requests": 3, "errors": 1, "prompt_tokens": 30, "completion_tokens": 3, **fields}


def test_days_without_usage_are_zero_bars_and_days_run_oldest_first():
    rows = [_row(day=date(2026, 12, 3)), _row(day=date(2026, 12, 1), errors=0)]
    requests, tokens = usage_charts(rows=rows, by="day", since=date(2026, 11, 30), until=date(2026, 12, 3),
                                    noun="day")
    assert requests.categories == ("2026-11-30", "2026-12-01", "2026-12-02", "2026-12-03")
    drawn = {(b.category, b.series): b.value for b in requests.bars if b.value}
    assert drawn == {("2026-12-01", "answered"): 3, ("2026-12-03", "answered"): 2,
                     ("2026-12-03", "errors"): 1}
    assert {(b.category, b.series): b.value for b in tokens.bars if b.value}[("2026-12-01", "prompt")] == 30
    assert ">12-01<" in requests.svg  # the short day under the bar; tooltips keep the full date


def test_labels_for_deleted_keys_personal_usage_and_long_lists():
    assert row_label(_row(key_id=None, key_name=None, key_last4=None), by="key") == "deleted keys"
    assert row_label(_row(key_id=4, key_name="ci", key_last4="a1B2"), by="key") == "ci …a1B2"
    assert row_label(_row(group_id=None, group_slug=None, group_name=None), by="group") == "personal"
    rows = [_row(model=f"m{i}") for i in range(MAX_ROWS + 5)]
    requests, _ = usage_charts(rows=rows, by="model", since=date(2026, 12, 1), until=date(2026, 12, 1),
                               noun="model")
    assert len(requests.categories) == MAX_ROWS  # the rest stay in the table under the chart
