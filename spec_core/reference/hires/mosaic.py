"""High-resolution scenes of the reference world: a 3x3 mosaic of panels, each a small-world scene
(objects with an optional sign, or a bar chart) drawn at the small world's 64 px, so a 192 px image
holds nine of them and any one detail (a sign's word, a bar's value, a small shape) sits in one
panel only.

Why panels of exactly one AnyRes tile: the hires target (LLaVA-NeXT, 64 px views, grid pinpoint
192x192) cuts a 192 px image into a 64 px base view (the whole image, downscaled 3x: the gist,
too coarse to read a sign) and 3x3 tiles of 64 px, one per panel. The vision tower is taught to see
on small-world scenes (stage 1), so every tile is in its training distribution, and a region
question is answered from one tile's 16 visual tokens among 172.

Why a frame around the image: the tower sees each tile alone, so a tile's visual tokens say what it
shows but not where it sits; only the decoder's rotary positions tell the nine tiles apart, and a
10-layer decoder of 192 wide did not learn to route "the top right panel" to the right 16 of 172
tokens by position in 3600 steps (measured without the frame: general VQA 0.22, text 0.0, chart
0.30, region dependence 0.56 with a perfect tower). With a 2 px frame around the whole image, each
tile shows the frame on the sides where it touches the image's border (top left: top and left,
center: none), so its place is in its pixels; stage 1 teaches the tower to say which panel every
patch is in, and the decoder finds a panel by content, as it finds a colour.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image, ImageDraw

from spec_core.reference.drawing import render
from spec_core.reference.scenes import Scene, scene_from_json, sample_scene

PANELS = 3                       # panels per side
PANEL_PX = 64                    # one panel = one small-world image = one AnyRes tile
IMAGE_PX = PANELS * PANEL_PX     # 192
PANEL_NAMES: tuple[str, ...] = (
    "top left", "top middle", "top right",
    "middle left", "center", "middle right",
    "bottom left", "bottom middle", "bottom right",
)
CHARTS = 2                       # chart panels per mosaic (reasoning reads across two)
PANEL_OBJECTS = (1, 3)           # objects per objects panel (small detail, bounded captions)
SIGN_PROB = 0.4                  # an objects panel carries a sign
FRAME_PX = 2                     # the frame around the image (thin: a sign's letters reach 1 px from a panel's side)
FRAME_RGB = (255, 0, 255)        # magenta: >= 140 in RGB from every object colour and background


@dataclass(frozen=True)
class Mosaic:
    """Nine panels in reading order (index = 3 * row + column)."""

    panels: tuple[Scene, ...]

    def __post_init__(self) -> None:
        if len(self.panels) != PANELS * PANELS:
            raise ValueError(f"a mosaic has {PANELS * PANELS} panels, got {len(self.panels)}")

    def where(self, kind: str, sign: bool = False) -> list[int]:
        """Panel indices of a kind ('objects' | 'chart'), with a sign if `sign`."""
        return [i for i, p in enumerate(self.panels) if p.kind == kind and (not sign or p.sign is not None)]


def sample_mosaic(rng: np.random.Generator) -> Mosaic:
    """Two chart panels at random places, the others objects panels (1-3 objects, 40% with a sign);
    at least one sign, and sign words distinct across the mosaic (so 'the sign that says X' names
    one panel)."""
    charts = {int(c) for c in rng.choice(PANELS * PANELS, size=CHARTS, replace=False)}
    while True:
        panels = tuple(sample_scene(rng, "chart") if i in charts else
                       sample_scene(rng, "objects", with_sign_prob=SIGN_PROB, n_objects=PANEL_OBJECTS)
                       for i in range(PANELS * PANELS))
        words = [p.sign.word for p in panels if p.sign is not None]
        if words and len(set(words)) == len(words):
            return Mosaic(panels)


def frame_panel(image: Image.Image, p: int) -> Image.Image:
    """A panel's image with the image frame drawn on the sides where panel p touches the mosaic's
    border (what its AnyRes tile shows; stage 1 of the hires tower trains on these)."""
    if not 0 <= p < PANELS * PANELS:
        raise ValueError(f"panel index must be in [0, {PANELS * PANELS}), got {p}")
    r, c = divmod(p, PANELS)
    out = image.copy()
    draw, w, h = ImageDraw.Draw(out), out.width, out.height
    sides = {(0, 0, w, FRAME_PX): r == 0, (0, h - FRAME_PX, w, h): r == PANELS - 1,
             (0, 0, FRAME_PX, h): c == 0, (w - FRAME_PX, 0, w, h): c == PANELS - 1}
    for (x0, y0, x1, y1), on in sides.items():
        if on:
            draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=FRAME_RGB)
    return out


def render_mosaic(mosaic: Mosaic) -> Image.Image:
    """The 192 px image: each panel rendered as a small-world image, framed where it touches the
    border, and pasted in place (so the whole image has a frame)."""
    canvas = Image.new("RGB", (IMAGE_PX, IMAGE_PX))
    for i, panel in enumerate(mosaic.panels):
        r, c = divmod(i, PANELS)
        canvas.paste(frame_panel(render(panel, PANEL_PX), i), (c * PANEL_PX, r * PANEL_PX))
    return canvas


def mosaic_to_json(mosaic: Mosaic, regions: list[list[int]]) -> str:
    """Canonical JSON: the panels (as scene dicts) and, per turn, the panels its answer reads."""
    return json.dumps({"panels": [asdict(p) for p in mosaic.panels], "regions": regions}, sort_keys=True)


def mosaic_from_json(text: str) -> tuple[Mosaic, list[list[int]]]:
    d = json.loads(text)
    return Mosaic(tuple(scene_from_json(json.dumps(p)) for p in d["panels"])), d["regions"]


def alter_panel(mosaic: Mosaic, p: int, rng: np.random.Generator) -> Mosaic:
    """The mosaic with panel p redrawn as another panel of its kind (a chart stays a chart; an
    objects panel keeps having a sign or not, with a word no panel of the mosaic shows): what the
    report's region dependence swaps in."""
    old = mosaic.panels[p]
    words = {q.sign.word for q in mosaic.panels if q.sign is not None}
    while True:
        if old.kind == "chart":
            new = sample_scene(rng, "chart")
        else:
            new = sample_scene(rng, "objects", with_sign_prob=float(old.sign is not None), n_objects=PANEL_OBJECTS)
        if new != old and (new.sign is None or new.sign.word not in words):
            return Mosaic(mosaic.panels[:p] + (new,) + mosaic.panels[p + 1:])
