"""The PNG writer (no matplotlib here): a valid file that decodes back to the pixels drawn, and the chart the
benchmark writes; and the SVG geometry of the dashboard's chart."""

import struct
import zlib

import pytest

from clawhub.core.charts import svg_chart
from clawhub.devtools.personas.plots import (
    BLACK,
    PNG_SIGNATURE,
    Canvas,
    band_chart_png,
    line_chart_png,
    png_bytes,
    text_width,
)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, RGB rows) of an 8-bit RGB PNG with filter 0 rows, checking every chunk's CRC."""
    assert data[:8] == PNG_SIGNATURE
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks.append((kind, body))
        pos += 12 + length
    assert [k for k, _ in chunks][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = 1 + width * 3
    assert len(raw) == height * stride
    rows = [raw[y * stride:(y + 1) * stride] for y in range(height)]
    assert all(row[0] == 0 for row in rows)  # filter type 0 (none) on every row
    return width, height, [row[1:] for row in rows]


def test_png_bytes_round_trips_through_zlib():
    pixels = bytearray(b"\xff\xff\xff" * 6)
    pixels[3:6] = b"\x10\x20\x30"  # (1, 0)
    pixels[15:18] = b"\x00\x00\xff"  # (2, 1)
    width, height, rows = decode_png(png_bytes(3, 2, pixels))
    assert (width, height) == (3, 2)
    assert rows[0][3:6] == b"\x10\x20\x30" and rows[1][6:9] == b"\x00\x00\xff" and rows[0][:3] == b"\xff" * 3


def test_png_bytes_refuses_the_wrong_number_of_bytes():
    with pytest.raises(ValueError):
        png_bytes(2, 2, b"\x00" * 11)


def test_canvas_draws_lines_end_to_end_and_text():
    canvas = Canvas(20, 10)
    canvas.line(1, 1, 18, 8, (255, 0, 0))
    assert canvas.get(1, 1) == (255, 0, 0) and canvas.get(18, 8) == (255, 0, 0)
    canvas.text(0, 0, "8", (0, 0, 255), scale=1)  # an 8 is a full 3x5 box with two holes
    assert canvas.get(0, 0) == (0, 0, 255) and canvas.get(1, 1) != (0, 0, 255)


def test_the_benchmark_chart_is_a_png_with_each_series_drawn(output_dir):
    series = {"rl student": [0.2, 0.4, 0.7, 0.9], "combine student": [0.2, 0.6, None, 0.95],
              "combine group": [0.2, 0.3]}
    data = line_chart_png(series, title="held-out compliance", width=480, height=300)
    (output_dir / "compliance.png").write_bytes(data)
    width, height, rows = decode_png(data)
    assert (width, height) == (480, 300)
    colours = {rows[y][x * 3:x * 3 + 3] for y in range(height) for x in range(width)}
    # The first three palette colours (one per series) and the target line's red are all there.
    for colour in ((37, 99, 235), (22, 163, 74), (217, 119, 6), (200, 60, 60)):
        assert bytes(colour) in colours


def test_a_long_legend_name_is_drawn_whole_inside_the_image():
    name = "combine brief prompt-only"  # 25 characters: the legend cut names at 23
    band = {"low": [0.0, 0.1], "high": [0.2, 0.3], "mean": [0.1, 0.2]}
    width = 720
    _, _, rows = decode_png(band_chart_png({name: band}, width=width, height=300))
    # The first legend entry's text is 10 px high from y=38; right of the middle, its black ink is the name's.
    black = bytes(BLACK)
    ink = [x for y in range(38, 48) for x in range(width // 2, width) if rows[y][x * 3:x * 3 + 3] == black]
    assert max(ink) < width - 1
    assert max(ink) - min(ink) + 1 >= text_width(name) - 4  # 25 glyphs of 8 px, less the last one's spacing


def test_svg_chart_places_versions_evenly_and_scales_scores():
    values = [("v1", -1.0, "v1", "retired"), ("v2", 0.0, "v2", "retired"), ("v3", 1.0, "v3", "active")]
    chart = svg_chart(values, width=240, height=120)
    xs = [p.x for p in chart.points]
    assert xs[0] == chart.left and xs[-1] == chart.right and xs[1] == (xs[0] + xs[2]) / 2
    ys = [p.y for p in chart.points]
    assert ys[0] == chart.bottom and ys[0] > ys[1] > ys[2]  # higher score, higher on the page
    assert chart.polyline == " ".join(f"{p.x},{p.y}" for p in chart.points)
    assert svg_chart([]) is None
