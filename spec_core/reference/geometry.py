"""Geometry shared by rendering and patch labels: grid cells, object boxes, shape outlines, sign
and chart layouts. Everything scales with the image size (designed at 64 px)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from PIL import ImageDraw, ImageFont

from spec_core.reference.scenes import Chart, Obj, Sign
from spec_core.reference.vocab import GRID, SIZE_FRACTIONS

TEXT_REGION = 2  # region id of every glyph and the chart axis
SIGN_FONT_PX = 16  # at 64 px: lowercase letters ~8-12 px wide, x-height ~9 px
SIGN_SLOT_PX = 12.0  # widest letter slot at 64 px; 6-letter words get (64 - 2) / 6 px
LABEL_FONT_PX = 11  # chart bar letters at 64 px
MIN_FONT_PX = 7


@lru_cache(maxsize=64)
def font(px: int) -> ImageFont.FreeTypeFont:
    """Pillow's bundled FreeType font at `px` pixels (deterministic, no font files needed)."""
    f = ImageFont.load_default(size=px)
    if not isinstance(f, ImageFont.FreeTypeFont):
        raise RuntimeError("Pillow was built without FreeType; the reference world needs "
                           "ImageFont.load_default(size=...) to return a scalable font.")
    return f


def cell_box(cell: int, size: int) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of a grid cell in pixels (half-open)."""
    side = size / GRID
    r, c = divmod(cell, GRID)
    return c * side, r * side, (c + 1) * side, (r + 1) * side


def cell_at(x: float, y: float, size: int) -> int:
    """Grid cell (row-major) containing pixel coordinate (x, y)."""
    col = min(int(x * GRID / size), GRID - 1)
    row = min(int(y * GRID / size), GRID - 1)
    return row * GRID + col


def object_centre(obj: Obj, size: int) -> tuple[float, float]:
    """Object centre in pixels: its free position if set, else its cell centre."""
    if obj.xy is not None:
        return obj.xy[0] * size, obj.xy[1] * size
    x0, y0, x1, y1 = cell_box(obj.cell, size)
    return (x0 + x1) / 2, (y0 + y1) / 2


def object_extent(obj: Obj, size: int) -> float:
    """Side of the object's bounding box in pixels."""
    return SIZE_FRACTIONS[obj.size] * size / GRID


def _star(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else 0.45 * r
        a = -math.pi / 2 + k * math.pi / 5
        pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return pts


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, ext: float,
               fill: tuple[int, int, int] | int) -> None:
    """Draw one shape of bounding-box side `ext` centred at (cx, cy) (pixel-centre coordinates)."""
    # PIL addresses pixels by their top-left corner; shift so (cx, cy) is a true centre.
    cx, cy, r = cx - 0.5, cy - 0.5, ext / 2
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "ring":
        width = max(2, round(ext * 0.22))
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=fill, width=width)
    elif shape == "square":
        s = 0.85 * r  # squares look larger than circles of the same box
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    elif shape == "star":
        draw.polygon(_star(cx, cy + 0.1 * r, 1.05 * r), fill=fill)
    elif shape == "cross":
        t = 0.36 * r
        draw.rectangle((cx - r, cy - t, cx + r, cy + t), fill=fill)
        draw.rectangle((cx - t, cy - r, cx + t, cy + r), fill=fill)
    else:
        raise ValueError(f"Unknown shape {shape!r}.")


@dataclass(frozen=True)
class SignLayout:
    """Where a sign and each of its letters go; `slots` are the glyph boxes (half-open) and
    `origins` the left-baseline ("ls") anchor that centres each glyph's ink in its slot."""

    word: str
    band: tuple[int, int, int, int]
    slots: tuple[tuple[float, float, float, float], ...]
    origins: tuple[tuple[float, float], ...]
    font_px: int


def _glyph_width(px: int, ch: str) -> int:
    left, _, right, _ = font(px).getbbox(ch, anchor="ls")
    return right - left


@lru_cache(maxsize=1024)
def sign_layout(sign: Sign, size: int) -> SignLayout:
    """One fixed-width slot per letter, centred; the font shrinks only if a glyph overflows it."""
    if not sign.word or not sign.word.isalpha() or not sign.word.islower():
        raise ValueError(f"Sign words must be lowercase letters a-z, got {sign.word!r}.")
    if not 0 <= sign.row < GRID:
        raise ValueError(f"Sign row must be in 0..{GRID - 1}, got {sign.row}.")
    s = size / 64
    y0, y1 = round(sign.row * size / GRID), round((sign.row + 1) * size / GRID)
    n = len(sign.word)
    slot = min(SIGN_SLOT_PX * s, (size - 2 * s) / n)
    px = max(MIN_FONT_PX, round(SIGN_FONT_PX * s))
    while px > MIN_FONT_PX and (max(_glyph_width(px, ch) for ch in sign.word) > slot
                                or _text_height(px, sign.word) > (y1 - y0) - 2):
        px -= 1
    x_start = (size - n * slot) / 2
    slots = tuple((x_start + i * slot, float(y0), x_start + (i + 1) * slot, float(y1))
                  for i in range(n))
    _, top, _, bottom = font(px).getbbox(sign.word, anchor="ls")
    baseline = round((y0 + y1) / 2 - (top + bottom) / 2)  # centre the word's ink vertically
    origins = []
    for ch, (x0, _, x1, _) in zip(sign.word, slots):
        left, _, right, _ = font(px).getbbox(ch, anchor="ls")
        origins.append((round((x0 + x1) / 2 - (left + right) / 2), baseline))
    return SignLayout(sign.word, (0, y0, size, y1), slots, tuple(origins), px)


def _text_height(px: int, text: str) -> int:
    _, top, _, bottom = font(px).getbbox(text, anchor="ls")
    return bottom - top


@dataclass(frozen=True)
class ChartLayout:
    """Bar columns (`slots`, x ranges), bar boxes (half-open ints), label row and axis."""

    labels: tuple[str, ...]
    slots: tuple[tuple[float, float], ...]
    bars: tuple[tuple[int, int, int, int], ...]
    label_y: float
    axis: tuple[int, int, int, int]
    font_px: int
    plot_top: int
    base_y: int


@lru_cache(maxsize=1024)
def chart_layout(chart: Chart, size: int) -> ChartLayout:
    """Equal columns across the width; bar height = value / 100 of the plot height."""
    if len(chart.labels) != len(chart.values) or not chart.values:
        raise ValueError("A chart needs as many labels as values, at least one.")
    if any(not 0 <= v <= 99 for v in chart.values):
        raise ValueError(f"Chart values must be integers in 0..99, got {chart.values}.")
    s = size / 64
    margin = 2 * s
    plot_top = round(3 * s)
    base_y = size - round(14 * s)  # room for the letters under the bars
    height = base_y - plot_top
    slot = (size - 2 * margin) / len(chart.values)
    slots, bars = [], []
    for i, v in enumerate(chart.values):
        x0 = margin + i * slot
        slots.append((x0, x0 + slot))
        bx0, bx1 = round(x0 + 0.15 * slot), round(x0 + 0.85 * slot)
        bars.append((bx0, base_y - round(height * v / 100), bx1, base_y))
    axis = (round(margin), base_y, round(size - margin), base_y + max(1, round(s)))
    return ChartLayout(tuple(chart.labels), tuple(slots), tuple(bars), base_y + 2 * s, axis,
                       max(MIN_FONT_PX, round(LABEL_FONT_PX * s)), plot_top, base_y)
