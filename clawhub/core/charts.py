"""Bar charts as inline SVG, drawn on the server: no JavaScript, no CDN, no plotting library.

``bar_chart`` lays out stacked bars (one stack per category, one segment per series) on a "nice" value axis,
vertically (days along x) or horizontally (names down the side, where long key and model names stay
readable), and returns a ``Chart`` whose ``svg`` is the markup. Every piece of text is escaped here, and the
markup is a ``str`` with ``__html__`` (what Django's and Jinja's escaping take as already safe), so a
template prints it (``{{ chart.svg }}``) with autoescaping on and no ``mark_safe``. The SVG is accessible on
its own: ``role="img"`` with a ``<title>`` and a ``<desc>`` that sums up each series, axis labels, a legend,
and a tooltip per bar; the table under a chart stays the full data. ``svg_chart`` gives the positions of the
dashboard's adapter-progress line chart, which its template draws.

Plain Python, no Django: the web pages and the benchmarks can both draw with it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

# Colour-blind-safe pairs (Okabe-Ito); the series order picks them.
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#f0e442", "#000000")
FONT = 'font-family="system-ui, sans-serif"'
CHAR_PX = 7  # average width of a 12px character, for laying out labels without measuring text
_ids = itertools.count(1)


class Svg(str):
    """Markup built here, every text in it escaped."""

    def __html__(self) -> str:
        return str.__str__(self)


@dataclass(frozen=True)
class Bar:
    category: str
    series: str
    value: float
    x: float
    y: float
    width: float
    height: float
    color: str


@dataclass(frozen=True)
class Chart:
    title: str
    svg: Svg
    bars: tuple[Bar, ...]
    series: tuple[str, ...]
    categories: tuple[str, ...]

    def __html__(self) -> str:
        return self.svg.__html__()


def nice_ticks(top: float, *, count: int = 4) -> list[float]:
    """0 and about ``count`` round steps (1, 2 or 5 times a power of ten) up to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [step * i for i in range(math.ceil(top / step - 1e-9) + 1)]


def short_number(value: float) -> str:
    """12, 1.5k, 2M: tick labels that fit beside an axis."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}" if value != int(value) else str(int(value))


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def bar_chart(
    *,
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    x_label: str,
    y_label: str,
    horizontal: bool = False,
    width: int = 460,
    height: int = 240,
    colors: Sequence[str] = PALETTE,
    tick_label: Callable[[str], str] = str,
) -> Chart:
    """Stacked bars: ``series`` maps a name to one value per category (in ``categories`` order).

    Vertical charts put the categories along x (labels thinned out to fit) and the values up y; horizontal
    ones put a row per category, the chart growing with the rows. ``x_label``/``y_label`` name the axes as
    seen (for a horizontal chart, x is the value axis). ``tick_label`` shortens what a vertical chart
    prints under its bars (tooltips and the description keep the full category)."""
    names = tuple(series)
    cats = tuple(str(c) for c in categories)
    for name, values in series.items():
        if len(values) != len(cats):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(cats)} categories")
    totals = [sum(max(0.0, float(series[n][i])) for n in names) for i in range(len(cats))]
    ticks = nice_ticks(max(totals, default=0.0))
    color = {name: colors[i % len(colors)] for i, name in enumerate(names)}
    uid = f"chart{next(_ids)}"
    box = _BarBox.fit(cats, horizontal=horizontal, width=width, height=height, top_value=ticks[-1])
    bars = _stack(box, cats, names, series, color)

    description = _describe(cats, names, series, x_label if horizontal else y_label)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {box.width} '
        f'{box.height}" width="{box.width}" height="{box.height}" aria-labelledby="{uid}-title {uid}-desc" '
        f'{FONT} font-size="12">',
        f'<title id="{uid}-title">{escape(title)}</title>',
        f'<desc id="{uid}-desc">{escape(description)}</desc>',
        f'<rect x="0" y="0" width="{box.width}" height="{box.height}" fill="#ffffff"/>',
        f'<text x="8" y="20" font-size="14" font-weight="600" fill="#1d1f23">{escape(title)}</text>',
    ]
    out += _legend(names, color, right=box.right)
    out += _value_grid(box, ticks)
    out += _category_labels(box, cats, tick_label)
    out += _bar_rects(bars)
    out += _axes(box, x_label, y_label)
    if not cats or not any(totals):
        out.append(f'<text x="{(box.left + box.right) / 2}" y="{(box.top + box.bottom) / 2}" '
                   'text-anchor="middle" fill="#555b63">No data in this range</text>')
    out.append("</svg>")
    return Chart(title=title, svg=Svg("".join(out)), bars=tuple(bars), series=names, categories=cats)


@dataclass(frozen=True)
class _BarBox:
    """Where a bar chart draws: the plot area, the band each category gets and the value axis's scale."""

    horizontal: bool
    width: int
    height: int
    left: float
    right: float
    top: float
    bottom: float
    band: float  # along the category axis, per category
    label_chars: int  # a horizontal chart's row labels are clipped to this
    top_value: float

    @classmethod
    def fit(cls, cats: Sequence[str], *, horizontal: bool, width: int, height: int,
            top_value: float) -> _BarBox:
        row = 22
        label_chars = min(28, max((len(c) for c in cats), default=4)) if horizontal else 0
        left = (12 + label_chars * CHAR_PX) if horizontal else 56
        top, right = 48, width - 16
        if horizontal:
            height = top + max(1, len(cats)) * row + 44
        bottom = height - 44
        band = ((bottom - top) if horizontal else (right - left)) / max(1, len(cats))
        return cls(horizontal, width, height, left, right, top, bottom, band, label_chars, top_value)

    def scale(self, v: float) -> float:
        value_span = (self.right - self.left) if self.horizontal else (self.bottom - self.top)
        return value_span * v / self.top_value


def _stack(box: _BarBox, cats: Sequence[str], names: Sequence[str], series: Mapping[str, Sequence[float]],
           color: Mapping[str, str]) -> list[Bar]:
    """One bar per category and series, each series' segment stacked on the ones before it."""
    bars: list[Bar] = []
    thickness = max(1.0, min(box.band * 0.72, 36.0))
    for i, cat in enumerate(cats):
        start = (box.top if box.horizontal else box.left) + box.band * i + (box.band - thickness) / 2
        base = 0.0
        for name in names:
            value = max(0.0, float(series[name][i]))
            length = box.scale(value)
            if box.horizontal:
                bar = Bar(cat, name, value, round(box.left + box.scale(base), 2), round(start, 2),
                          round(length, 2), round(thickness, 2), color[name])
            else:
                bar = Bar(cat, name, value, round(start, 2), round(box.bottom - box.scale(base) - length, 2),
                          round(thickness, 2), round(length, 2), color[name])
            bars.append(bar)
            base += value
    return bars


def _value_grid(box: _BarBox, ticks: Sequence[float]) -> list[str]:
    """Value gridlines and their labels."""
    out = []
    for tick in ticks:
        label = escape(short_number(tick))
        if box.horizontal:
            x = round(box.left + box.scale(tick), 2)
            out.append(f'<line x1="{x}" x2="{x}" y1="{box.top}" y2="{box.bottom}" stroke="#e4e1dc"/>')
            out.append(f'<text x="{x}" y="{box.bottom + 16}" text-anchor="middle" fill="#555b63">'
                       f"{label}</text>")
        else:
            y = round(box.bottom - box.scale(tick), 2)
            out.append(f'<line x1="{box.left}" x2="{box.right}" y1="{y}" y2="{y}" stroke="#e4e1dc"/>')
            out.append(f'<text x="{box.left - 6}" y="{y + 4}" text-anchor="end" fill="#555b63">'
                       f"{label}</text>")
    return out


def _category_labels(box: _BarBox, cats: Sequence[str], tick_label: Callable[[str], str]) -> list[str]:
    """Every one for rows; along x, as many as fit without overlapping."""
    out = []
    if box.horizontal:
        for i, cat in enumerate(cats):
            y = round(box.top + box.band * i + box.band / 2 + 4, 2)
            out.append(f'<text x="{box.left - 6}" y="{y}" text-anchor="end" fill="#1d1f23">'
                       f"<title>{escape(cat)}</title>{escape(_clip(cat, box.label_chars))}</text>")
    elif cats:
        shown = [tick_label(c) for c in cats]
        widest = max(len(c) for c in shown) * CHAR_PX + 8
        every = max(1, math.ceil(widest / box.band))
        for i in range(0, len(cats), every):
            x = round(box.left + box.band * i + box.band / 2, 2)
            out.append(f'<text x="{x}" y="{box.bottom + 16}" text-anchor="middle" fill="#555b63">'
                       f"{escape(shown[i])}</text>")
    return out


def _bar_rects(bars: Sequence[Bar]) -> list[str]:
    out = []
    for bar in bars:
        if bar.value <= 0:
            continue
        tip = f"{bar.category} · {bar.series}: {short_number(bar.value)}"
        out.append(
            f'<rect class="bar" x="{bar.x}" y="{bar.y}" width="{bar.width}" height="{bar.height}" '
            f'fill="{bar.color}" data-series={quoteattr(bar.series)} data-category={quoteattr(bar.category)} '
            f'data-value="{bar.value:g}"><title>{escape(tip)}</title></rect>'
        )
    return out


def _axes(box: _BarBox, x_label: str, y_label: str) -> list[str]:
    """The axes and their names."""
    left, right, top, bottom = box.left, box.right, box.top, box.bottom
    out = [
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{bottom}" stroke="#1d1f23"/>',
        f'<line x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#1d1f23"/>',
        f'<text class="axis-label" x="{(left + right) / 2}" y="{box.height - 8}" text-anchor="middle" '
        f'fill="#1d1f23">{escape(x_label)}</text>',
    ]
    if box.horizontal:
        out.append(f'<text class="axis-label" x="8" y="{top - 10}" fill="#1d1f23">{escape(y_label)}</text>')
    else:
        middle = (top + bottom) / 2
        out.append(f'<text class="axis-label" transform="translate(14 {middle}) rotate(-90)" '
                   f'text-anchor="middle" fill="#1d1f23">{escape(y_label)}</text>')
    return out


def _legend(names: Sequence[str], color: Mapping[str, str], *, right: float) -> list[str]:
    """Swatches and names, right-aligned on the line under the title."""
    out, x = [], right
    for name in reversed(names):
        x -= len(name) * CHAR_PX
        out.append(f'<text x="{x}" y="38" fill="#1d1f23">{escape(name)}</text>')
        x -= 16
        out.append(f'<rect x="{x}" y="28" width="11" height="11" fill="{color[name]}"/>')
        x -= 14
    return out


def _describe(cats: Sequence[str], names: Sequence[str], series: Mapping[str, Sequence[float]],
              value_label: str) -> str:
    """The sentence a screen reader reads for the chart: the span and each series' total and peak."""
    if not cats:
        return "No data."
    parts = [f"{len(cats)} bars from {cats[0]} to {cats[-1]}" if len(cats) > 1 else f"1 bar: {cats[0]}"]
    for name in names:
        values = [float(v) for v in series[name]]
        peak = max(range(len(values)), key=values.__getitem__)
        parts.append(f"{name}: {short_number(sum(values))} in all, most at {cats[peak]} "
                     f"({short_number(values[peak])})")
    return f"{value_label}. " + "; ".join(parts) + "."


# --- Line-chart geometry for the dashboard's adapter progress (the template draws it; autoescaping on) ----


@dataclass(frozen=True)
class ChartPoint:
    x: float
    y: float
    label: str  # "v3"
    value: float
    title: str  # tooltip
    kind: str = ""  # a CSS modifier, e.g. the version's state


@dataclass(frozen=True)
class SvgChart:
    width: int
    height: int
    points: tuple[ChartPoint, ...]
    polyline: str  # "x,y x,y ..."
    gridlines: tuple[tuple[float, str], ...]  # (y, label)
    left: int
    right: int
    bottom: int


def svg_chart(values: Sequence[tuple[str, float, str, str]], *, y_min: float = -1.0, y_max: float = 1.0,
              width: int = 560, height: int = 180) -> SvgChart | None:
    """Positions for a line chart of (label, value, tooltip, kind) in order, evenly spaced; None without
    values. Values outside [y_min, y_max] are drawn at the edge."""
    if not values:
        return None
    left, right, top, bottom = 40, width - 12, 12, height - 26
    span = (y_max - y_min) or 1.0
    n = len(values)

    def y_of(v: float) -> float:
        return round(bottom - (bottom - top) * (max(y_min, min(y_max, v)) - y_min) / span, 1)

    points = tuple(
        ChartPoint(x=round(left + (right - left) * (i / (n - 1) if n > 1 else 0.5), 1), y=y_of(v),
                   label=label, value=v, title=title, kind=kind)
        for i, (label, v, title, kind) in enumerate(values)
    )
    grid = tuple((y_of(y_min + span * k / 4), f"{y_min + span * k / 4:g}") for k in range(5))
    return SvgChart(width=width, height=height, points=points,
                    polyline=" ".join(f"{p.x},{p.y}" for p in points), gridlines=grid, left=left, right=right,
                    bottom=bottom)


def step_chart(*, title: str, steps: Sequence[int], values: Sequence[float | None], y_label: str,
               color: str = PALETTE[0], width: int = 460, height: int = 200) -> Svg | None:
    """One value per training step as a line with a dot per step (its tooltip: step and value), the value
    axis from its lowest to its highest value (a dashed line at 0 when the range crosses it). Steps without
    a value are left out; None without any."""
    points = [(int(s), float(v)) for s, v in zip(steps, values, strict=True)
              if isinstance(v, int | float) and math.isfinite(v)]
    if not points:
        return None
    low, high = min(v for _, v in points), max(v for _, v in points)
    pad = (high - low) * 0.1 or max(abs(high) * 0.1, 0.05)
    low, high = low - pad, high + pad
    first, last = points[0][0], points[-1][0]
    left, right, top, bottom = 56, width - 16, 30, height - 34

    def x(step: int) -> float:
        return left + (right - left) * ((step - first) / (last - first) if last > first else 0.5)

    def y(value: float) -> float:
        return bottom - (bottom - top) * (value - low) / (high - low)

    cid = next(_ids)
    lowest, highest = min(v for _, v in points), max(v for _, v in points)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="step-chart" role="img" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="12" '
             f'aria-labelledby="sc{cid}t sc{cid}d">',
             f'<title id="sc{cid}t">{escape(title)}</title>',
             f'<desc id="sc{cid}d">{escape(y_label)} over {len(points)} steps: from {points[0][1]:.4g} at '
             f'step {first} to {points[-1][1]:.4g} at step {last} (lowest {lowest:.4g}, highest '
             f'{highest:.4g})</desc>',
             f'<text x="{(left + right) / 2:.0f}" y="16" text-anchor="middle" font-weight="600">'
             f'{escape(title)}</text>']
    for value in (low, high):
        parts.append(f'<text x="{left - 6}" y="{y(value):.1f}" text-anchor="end" dominant-baseline="middle" '
                     f'fill="#6b7078">{value:.3g}</text>')
    if low < 0 < high:
        parts.append(f'<line x1="{left}" x2="{right}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#9ca3af" '
                     'stroke-dasharray="4 3"/>')
    parts.append(f'<line x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#d1d5db"/>')
    for step in sorted({first, last}):
        parts.append(f'<text x="{x(step):.1f}" y="{bottom + 16}" text-anchor="middle" fill="#6b7078">'
                     f'{step}</text>')
    parts.append(f'<text x="{(left + right) / 2:.0f}" y="{height - 4}" text-anchor="middle" '
                 'fill="#6b7078">step</text>')
    if len(points) > 1:
        line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
    for s, v in points:
        parts.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="{color}">'
                     f'<title>step {s}: {escape(y_label)} {v:.4g}</title></circle>')
    parts.append("</svg>")
    return Svg("".join(parts))
