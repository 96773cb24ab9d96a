"""clawhub/core/charts.py: stacked bars on a nice value axis, valid and escaped SVG, accessible text."""

import xml.etree.ElementTree as ET

import pytest
from django.template import Context, Template

from clawhub.core.charts import bar_chart, nice_ticks, short_number

NS = {"s": "http://www.w3.org/2000/svg"}


def _parse(chart):
    return ET.fromstring(chart.svg)


def test_nice_ticks_and_short_numbers():
    assert nice_ticks(3) == [0, 1, 2, 3]
    assert nice_ticks(1411) == [0, 500, 1000, 1500]
    assert nice_ticks(0) == [0.0, 1.0]
    assert [short_number(v) for v in (0, 12, 1500, 2_000_000, 0.25)] == ["0", "12", "1.5k", "2M", "0.25"]


def test_vertical_stacks_sum_to_the_category_total_and_share_a_baseline():
    chart = bar_chart(title="Requests per day", categories=["2026-11-30", "2026-12-01"],
                      series={"answered": [2, 1], "errors": [1, 0]}, x_label="day", y_label="requests")
    first = [b for b in chart.bars if b.category == "2026-11-30"]
    answered, errors = first
    # errors sit on top of answered; the axis tops out at 3, so the stack fills the plot.
    assert answered.y == pytest.approx(errors.y + errors.height)
    assert answered.height == pytest.approx(2 * errors.height, abs=0.02)
    second = [b for b in chart.bars if b.category == "2026-12-01"]
    assert second[0].y + second[0].height == pytest.approx(answered.y + answered.height)  # same baseline
    svg = _parse(chart)
    drawn = [(r.get("data-category"), r.get("data-series"), r.get("data-value"))
             for r in svg.iterfind("s:rect[@class='bar']", NS)]
    assert drawn == [("2026-11-30", "answered", "2"), ("2026-11-30", "errors", "1"),
                     ("2026-12-01", "answered", "1")]
    assert svg.get("role") == "img"
    assert svg.find("s:title", NS).text == "Requests per day"
    assert "answered: 3 in all" in svg.find("s:desc", NS).text
    assert [t.text for t in svg.iterfind("s:text[@class='axis-label']", NS)] == ["day", "requests"]


def test_horizontal_rows_grow_the_chart_and_clip_long_names():
    names = [f"key {i} with a rather long descriptive name" for i in range(5)]
    chart = bar_chart(title="Tokens per key", categories=names, series={"prompt": [5, 4, 3, 2, 1]},
                      x_label="tokens", y_label="key", horizontal=True)
    svg = _parse(chart)
    assert int(svg.get("height")) > 5 * 20
    widths = [b.width for b in chart.bars]
    assert widths == sorted(widths, reverse=True) and widths[0] > 0
    labels = [t for t in svg.iterfind("s:text", NS) if t.find("s:title", NS) is not None]
    assert [t.find("s:title", NS).text for t in labels] == names  # the full name stays as a tooltip
    assert all(len("".join(t.itertext())) < len(names[0]) * 2 for t in labels)


def test_hostile_labels_are_escaped_and_the_template_prints_it_unescaped_once():
    chart = bar_chart(title='Requests <script>alert(1)</script>', categories=['"><img src=x onerror=1>'],
                      series={"a&b": [1]}, x_label="x", y_label="y", horizontal=True)
    svg = _parse(chart)  # would not parse if anything broke out of its element or attribute
    assert svg.find("s:title", NS).text == "Requests <script>alert(1)</script>"
    assert not svg.findall(".//s:script", NS) and not svg.findall(".//s:img", NS)
    rendered = Template("{{ chart.svg }}").render(Context({"chart": chart}))
    assert rendered == chart.svg  # autoescaping on, and the markup is not escaped a second time


def test_no_data_says_so():
    chart = bar_chart(title="Requests per key", categories=[], series={"answered": []}, x_label="requests",
                      y_label="key", horizontal=True)
    assert chart.bars == () and "No data in this range" in chart.svg
    with pytest.raises(ValueError):
        bar_chart(title="t", categories=["a"], series={"s": [1, 2]}, x_label="x", y_label="y")
