"""Rendering of reference-world scenes, the per-patch labels that share its geometry, texture
noise for the image generator, videos, and a colour classifier for generated images."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from spec_core.reference.geometry import (TEXT_REGION, ChartLayout, SignLayout, cell_at,
                                          chart_layout, draw_shape, font, object_centre,
                                          object_extent, sign_layout)
from spec_core.reference.scenes import Scene, move_objects
from spec_core.reference.vocab import (BACKGROUNDS, BLACK, COLOUR_NAMES, COLOURS, LETTERS,
                                       MAX_BARS, SHAPES, SIZES, WHITE, WORD_INDEX)

SIGN_REGION = 1
OBJECT_REGION = 10  # object i -> 10 + i
BAR_REGION = 40  # bar i -> 40 + i


def text_colour(background: str) -> tuple[int, int, int]:
    """Black on light backgrounds, white on dark ones (chart labels and axis)."""
    r, g, b = BACKGROUNDS[background]
    return BLACK if 0.299 * r + 0.587 * g + 0.114 * b > 110 else WHITE


@dataclass
class _Canvas:
    """An RGB image and a region-id map painted with the same primitives."""

    rgb: Image.Image
    regions: Image.Image

    def __post_init__(self) -> None:
        self._d_rgb = ImageDraw.Draw(self.rgb)
        self._d_reg = ImageDraw.Draw(self.regions)
        self._d_reg.fontmode = "1"  # no anti-aliasing: region ids must not blend into each other

    def shape(self, shape: str, cx: float, cy: float, ext: float, fill: tuple, region: int) -> None:
        draw_shape(self._d_rgb, shape, cx, cy, ext, fill)
        draw_shape(self._d_reg, shape, cx, cy, ext, region)

    def rect(self, box: tuple[int, int, int, int], fill: tuple, region: int) -> None:
        x0, y0, x1, y1 = box  # half-open box -> PIL's inclusive corners
        if x1 > x0 and y1 > y0:
            self._d_rgb.rectangle((x0, y0, x1 - 1, y1 - 1), fill=fill)
            self._d_reg.rectangle((x0, y0, x1 - 1, y1 - 1), fill=region)

    def text(self, xy: tuple[float, float], s: str, px: int, fill: tuple, anchor: str) -> None:
        f = font(px)
        self._d_rgb.text(xy, s, font=f, fill=fill, anchor=anchor)
        self._d_reg.text(xy, s, font=f, fill=TEXT_REGION, anchor=anchor)


def _paint_sign(canvas: _Canvas, lay: SignLayout) -> None:
    canvas.rect(lay.band, WHITE, SIGN_REGION)
    for ch, xy in zip(lay.word, lay.origins):
        canvas.text(xy, ch, lay.font_px, BLACK, "ls")


def _paint_chart(canvas: _Canvas, lay: ChartLayout, colour: str, background: str) -> None:
    ink = text_colour(background)
    for i, (bar, (x0, x1), label) in enumerate(zip(lay.bars, lay.slots, lay.labels)):
        canvas.rect(bar, COLOURS[colour], BAR_REGION + i)
        canvas.text(((x0 + x1) / 2, lay.label_y), label, lay.font_px, ink, "mt")
    canvas.rect(lay.axis, ink, TEXT_REGION)


def paint(scene: Scene, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Clean render as (H, W, 3) uint8 RGB and the (H, W) uint8 region-id map."""
    if size < 16:
        raise ValueError(f"size must be >= 16 pixels, got {size}.")
    if scene.background not in BACKGROUNDS:
        raise ValueError(f"Unknown background {scene.background!r}.")
    canvas = _Canvas(Image.new("RGB", (size, size), BACKGROUNDS[scene.background]),
                     Image.new("L", (size, size), 0))
    if scene.sign is not None:
        _paint_sign(canvas, sign_layout(scene.sign, size))
    for i, obj in enumerate(scene.objects):
        cx, cy = object_centre(obj, size)
        canvas.shape(obj.shape, cx, cy, object_extent(obj, size), COLOURS[obj.colour],
                     OBJECT_REGION + i)
    if scene.chart is not None:
        _paint_chart(canvas, chart_layout(scene.chart, size), scene.chart.colour, scene.background)
    return np.asarray(canvas.rgb).copy(), np.asarray(canvas.regions).copy()


@lru_cache(maxsize=8)
def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    return yy, xx


def _texture(rgb: np.ndarray, regions: np.ndarray, texture: float,
             pattern_rng: np.random.Generator, noise_rng: np.random.Generator) -> np.ndarray:
    # Colour jitter: one offset per region id (drawn for all 256 ids so the stream of draws
    # does not depend on which regions exist).
    out = rgb.astype(np.float32) + (pattern_rng.uniform(-1, 1, (256, 3)) * 12 * texture)[regions]
    yy, xx = _grid(rgb.shape[0])
    for _ in range(3):  # low-frequency pattern: a few oblique waves of 0.5-3 cycles per image
        fx, fy = pattern_rng.uniform(0.5, 3.0, 2) * pattern_rng.choice([-1, 1], 2)
        phase = pattern_rng.uniform(0, 2 * np.pi)
        amp = pattern_rng.uniform(0.5, 1.0, 3).astype(np.float32)
        out += np.sin(2 * np.pi * (fx * xx + fy * yy) + phase)[..., None] * amp * 8 * texture
    out += noise_rng.normal(0, 10 * texture, out.shape).astype(np.float32)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def render(scene: Scene, size: int = 64, texture: float = 0.0,
           rng: np.random.Generator | None = None) -> Image.Image:
    """Draw a scene as an RGB image; texture in [0, 1] adds jitter, pattern, noise (needs rng)."""
    if not 0.0 <= texture <= 1.0:
        raise ValueError(f"texture must be in [0, 1], got {texture}.")
    rgb, regions = paint(scene, size)
    if texture > 0:
        if rng is None:
            raise ValueError("render(texture > 0) needs an explicit np.random.Generator rng.")
        rgb = _texture(rgb, regions, texture, rng, rng)
    return Image.fromarray(rgb, "RGB")


def render_video(scene: Scene, velocities: list[tuple[float, float]], n_frames: int = 8,
                 size: int = 64, texture: float = 0.0,
                 rng: np.random.Generator | None = None) -> list[Image.Image]:
    """Frames of the scene's objects moving linearly (bouncing); texture pattern is static, noise
    changes per frame."""
    frames = move_objects(scene, velocities, n_frames)
    if texture <= 0:
        return [render(f, size) for f in frames]
    if rng is None:
        raise ValueError("render_video(texture > 0) needs an explicit np.random.Generator rng.")
    pattern_seed = int(rng.integers(2**63))
    images = []
    for f in frames:
        rgb, regions = paint(f, size)
        rgb = _texture(rgb, regions, texture, np.random.default_rng(pattern_seed), rng)
        images.append(Image.fromarray(rgb, "RGB"))
    return images


def _patch_centres(size: int, patch: int) -> tuple[np.ndarray, np.ndarray]:
    if patch < 1 or size % patch:
        raise ValueError(f"size ({size}) must be a positive multiple of patch ({patch}).")
    c = (np.arange(size // patch) + 0.5) * patch
    cy, cx = np.meshgrid(c, c, indexing="ij")
    return cx.ravel(), cy.ravel()


def patch_labels(scene: Scene, size: int = 64, patch: int = 8) -> dict[str, np.ndarray]:
    """Dense per-patch (row-major) and image-level labels, from the same geometry as `render`."""
    cx, cy = _patch_centres(size, patch)
    n = cx.size
    cell = np.array([cell_at(x, y, size) for x, y in zip(cx, cy)], dtype=np.int64)
    out = {k: np.zeros(n, dtype=np.int64) for k in ("colour", "shape", "size", "char", "bar")}
    out["cell"] = cell
    out["bar_value"] = np.full(n, -100, dtype=np.int64)
    for obj in scene.objects:  # later objects win, as they are drawn on top
        m = cell == obj.cell
        out["colour"][m] = 1 + COLOUR_NAMES.index(obj.colour)
        out["shape"][m] = 1 + SHAPES.index(obj.shape)
        out["size"][m] = 1 + SIZES.index(obj.size)
    word = -1
    if scene.sign is not None:
        lay = sign_layout(scene.sign, size)
        word = WORD_INDEX.get(scene.sign.word, -1)
        for ch, (x0, y0, x1, y1) in zip(lay.word, lay.slots):
            out["char"][(cx >= x0) & (cx < x1) & (cy >= y0) & (cy < y1)] = 1 + LETTERS.index(ch)
    values = np.full(MAX_BARS, -100, dtype=np.int64)
    n_bars = 0
    if scene.chart is not None:
        lay_c = chart_layout(scene.chart, size)
        n_bars = len(scene.chart.values)
        for i, ((x0, x1), v) in enumerate(zip(lay_c.slots, scene.chart.values)):
            m = (cx >= x0) & (cx < x1)
            out["bar"][m] = 1 + i
            out["bar_value"][m] = v // 10
            values[i] = v // 10
    out["count"] = np.array(len(scene.objects), dtype=np.int64)
    out["word"] = np.array(word, dtype=np.int64)
    out["n_bars"] = np.array(n_bars, dtype=np.int64)
    out["values"] = values
    return out


def _region_colours(scene: Scene) -> dict[int, str]:
    ids = {OBJECT_REGION + i: o.colour for i, o in enumerate(scene.objects)}
    if scene.chart is not None:
        ids |= {BAR_REGION + i: scene.chart.colour for i in range(len(scene.chart.values))}
    return ids


def scene_dominant_colour(scene: Scene, size: int = 64) -> str | None:
    """The object/bar colour covering the most pixels of the clean render (None if none)."""
    _, regions = paint(scene, size)
    counts = np.bincount(regions.ravel(), minlength=256)
    areas: dict[str, int] = {}
    for rid, colour in _region_colours(scene).items():
        areas[colour] = areas.get(colour, 0) + int(counts[rid])
    if not areas or max(areas.values()) == 0:
        return None
    return max(areas, key=lambda c: areas[c])


# Neutral greys (black .. white): anti-aliased sign text and axes blend into these, not into
# a palette colour.
_NEUTRALS = [(v, v, v) for v in range(0, 256, 32)] + [WHITE]


def dominant_colour(image: Image.Image, background: str) -> str | None:
    """Palette colour covering the most pixels of an image (nearest-colour vote after a 3x3
    median filter, so texture noise is suppressed while edges stay sharp); background and
    neutral grey pixels do not count."""
    if background not in BACKGROUNDS:
        raise ValueError(f"Unknown background {background!r}; expected one of "
                         f"{tuple(BACKGROUNDS)}.")
    arr = np.asarray(image.convert("RGB"), dtype=np.float32)
    h, w, _ = arr.shape
    pad = np.pad(arr, ((1, 1), (1, 1), (0, 0)), mode="edge")
    smooth = np.median(np.stack([pad[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)]),
                       axis=0)
    refs = np.array([COLOURS[c] for c in COLOUR_NAMES] + [BACKGROUNDS[background]] + _NEUTRALS,
                    dtype=np.float32)
    nearest = ((smooth[:, :, None, :] - refs) ** 2).sum(-1).argmin(-1)
    counts = np.bincount(nearest.ravel(), minlength=len(refs))[:len(COLOUR_NAMES)]
    # Below ~0.2% of the image it is stray edge pixels, not a region.
    if counts.max() < max(4, h * w // 500):
        return None
    return COLOUR_NAMES[int(counts.argmax())]
