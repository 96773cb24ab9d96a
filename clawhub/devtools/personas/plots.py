"""Plots without a plotting library: the benchmark's PNG line and band charts.

matplotlib is not in the environment (and pyproject is not ours to grow), so ``Canvas`` draws lines, boxes and
a 3x5 pixel font on an RGB raster and ``png_bytes`` encodes it (zlib + struct: signature, IHDR, one IDAT,
IEND, filter 0 on every row). Plain Python; no Django.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (20, 20, 20)
GRID: Color = (225, 228, 232)
MUTED: Color = (120, 120, 120)
TARGET: Color = (200, 60, 60)
PALETTE: tuple[Color, ...] = (
    (37, 99, 235), (22, 163, 74), (217, 119, 6), (147, 51, 234), (8, 145, 178), (190, 24, 93),
    (101, 163, 13), (71, 85, 105), (234, 88, 12), (79, 70, 229), (13, 148, 136), (161, 98, 7),
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_bytes(width: int, height: int, rgb: bytes | bytearray) -> bytes:
    """An 8-bit RGB PNG of ``width`` x ``height`` from row-major RGB bytes."""
    if width <= 0 or height <= 0 or len(rgb) != width * height * 3:
        raise ValueError(f"need {width}x{height}x3 = {width * height * 3} bytes of RGB, got {len(rgb)}")
    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[y * stride:(y + 1) * stride]) for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, truecolour, no interlace
    idat = zlib.compress(raw, 9)
    return PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


# 3x5 glyphs, one string of five 3-pixel rows each; lower case is drawn as upper case.
_FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    ":": "000010000010000", "%": "101001010100101", "/": "001001010100100", "(": "010100100100010",
    ")": "010001001001010", "+": "000010111010000", "=": "000111000111000", "_": "000000000000111",
    " ": "000000000000000", ",": "000000000010100",
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010", "P": "110101110100100",
    "Q": "010101101110011", "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111",
}


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(color)

    def get(self, x: int, y: int) -> Color:
        i = (y * self.width + x) * 3
        return tuple(self.pixels[i:i + 3])  # type: ignore[return-value]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                self.set(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1, dash: int = 0) -> None:
        """Bresenham, ``width`` pixels thick (a square brush); ``dash`` > 0 draws dash-long pieces, gaps."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, step, half = dx + dy, 0, width // 2
        while True:
            if not dash or (step // dash) % 2 == 0:
                self.rect(x0 - half, y0 - half, x0 - half + width - 1, y0 - half + width - 1, color)
            if x0 == x1 and y0 == y1:
                return
            e2, step = 2 * err, step + 1
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> int:
        """Draws ``text`` with its top-left corner at (x, y); returns the x after it."""
        for ch in text.upper():
            glyph = _FONT.get(ch, _FONT["_"])
            for i, bit in enumerate(glyph):
                if bit == "1":
                    gx, gy = x + (i % 3) * scale, y + (i // 3) * scale
                    self.rect(gx, gy, gx + scale - 1, gy + scale - 1, color)
            x += 4 * scale
        return x

    def png(self) -> bytes:
        return png_bytes(self.width, self.height, self.pixels)


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * 4 * scale


@dataclass(frozen=True)
class _Frame:
    """The plot area of a compliance chart: 0..1 up, update number across, the legend on the right."""

    canvas: Canvas
    left: int
    right: int
    top: int
    bottom: int
    x_max: int

    def px(self, i: float) -> int:
        return round(self.left + (self.right - self.left) * i / self.x_max)

    def py(self, v: float) -> int:
        return round(self.bottom - (self.bottom - self.top) * max(0.0, min(1.0, v)))


def _frame(width: int, height: int, longest: int, names: Sequence[str]) -> _Frame:
    """The legend gets what its longest name needs (at least 230 px); the plot area the rest."""
    legend = max([230] + [text_width(name) + 46 for name in names])
    return _Frame(Canvas(width, height), 52, width - legend, 34, height - 40, max(1, longest - 1))


def _axes(f: _Frame, *, title: str, x_label: str, target: float | None, grid_dash: int = 0) -> None:
    canvas = f.canvas
    for tick in range(6):
        v = tick / 5
        canvas.line(f.left, f.py(v), f.right, f.py(v), GRID, dash=grid_dash)
        canvas.text(f.left - 8 - text_width(f"{v:.1f}"), f.py(v) - 5, f"{v:.1f}", MUTED)
    every = max(1, f.x_max // 8)
    for i in range(0, f.x_max + 1, every):
        canvas.line(f.px(i), f.bottom, f.px(i), f.bottom + 4, MUTED)
        canvas.text(f.px(i) - text_width(str(i)) // 2, f.bottom + 8, str(i), MUTED)
    canvas.line(f.left, f.top, f.left, f.bottom, BLACK)
    canvas.line(f.left, f.bottom, f.right, f.bottom, BLACK)
    if target is not None:
        canvas.line(f.left, f.py(target), f.right, f.py(target), TARGET, dash=6)
    canvas.text(f.left, 10, title or "compliance", BLACK)
    canvas.text(f.right - text_width(x_label), f.bottom + 24, x_label, MUTED)


def _series(f: _Frame, n: int, name: str, values: Sequence[float | None], *,
            swatch: Color | None = None) -> None:
    """One series' line and points, and its legend entry (with a filled swatch behind it for a band)."""
    canvas, color = f.canvas, PALETTE[n % len(PALETTE)]
    points = [(f.px(i), f.py(v)) for i, v in enumerate(values) if v is not None]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        canvas.line(x0, y0, x1, y1, color, width=2)
    for x, y in points:
        canvas.rect(x - 2, y - 2, x + 2, y + 2, color)
    ly = f.top + 4 + n * 18
    if swatch is not None:
        canvas.rect(f.right + 12, ly, f.right + 32, ly + 8, swatch)
    canvas.line(f.right + 12, ly + 4, f.right + 32, ly + 4, color, width=3)
    canvas.text(f.right + 38, ly, name, BLACK)


def line_chart_png(series: Mapping[str, Sequence[float | None]], *, title: str = "",
                   x_label: str = "promoted updates", target: float | None = 0.8,
                   width: int = 720, height: int = 420) -> bytes:
    """Compliance (0..1) against update number (0 = the base model) for each named series; None values are
    skipped (a series that stopped early). A dashed red line marks the target."""
    f = _frame(width, height, max((len(v) for v in series.values()), default=1), list(series))
    _axes(f, title=title, x_label=x_label, target=target)
    for n, (name, values) in enumerate(series.items()):
        _series(f, n, name, values)
    return f.canvas.png()


def _tint(color: Color, amount: float = 0.75) -> Color:
    return tuple(round(c + (255 - c) * amount) for c in color)  # type: ignore[return-value]


def band_chart_png(bands: Mapping[str, Mapping[str, Sequence[float | None]]], *, title: str = "",
                   x_label: str = "promoted updates", target: float | None = 0.8,
                   width: int = 720, height: int = 420) -> bytes:
    """One band per named series: the range over seeds (``low``..``high``) filled in a light tint of the
    series' colour, the ``mean`` drawn over it. Axes as in line_chart_png."""
    f = _frame(width, height, max((len(b["mean"]) for b in bands.values()), default=1), list(bands))
    px, py = f.px, f.py
    for n, values in enumerate(bands.values()):  # fills first, so that no band hides a mean line
        tint = _tint(PALETTE[n % len(PALETTE)])
        low, high = values["low"], values["high"]
        for i in range(len(low) - 1):
            if None in (low[i], high[i], low[i + 1], high[i + 1]):
                continue
            for x in range(px(i), px(i + 1) + 1):
                frac = (x - px(i)) / max(1, px(i + 1) - px(i))
                y_lo = py(low[i] + frac * (low[i + 1] - low[i]))
                y_hi = py(high[i] + frac * (high[i + 1] - high[i]))
                f.canvas.line(x, y_hi, x, y_lo, tint)
    _axes(f, title=title, x_label=x_label, target=target, grid_dash=2)
    for n, (name, values) in enumerate(bands.items()):
        _series(f, n, name, values["mean"], swatch=_tint(PALETTE[n % len(PALETTE)]))
    return f.canvas.png()
