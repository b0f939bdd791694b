"""High-resolution scenes of the reference world: a 3x3 mosaic of panels, each a small-world scene
(objects with an optional sign, or a bar chart) drawn at the small world's 64 px, so a 192 px image
holds nine of them and any one detail (a sign's word, a bar's value, a small shape) sits in one
panel only.

Why panels of exactly one AnyRes tile: the hires target (LLaVA-NeXT, 64 px views, grid pinpoint
192x192) cuts a 192 px image into a 64 px base view (the whole image, downscaled 3x: the gist,
too coarse to read a sign) and 3x3 tiles of 64 px, one per panel. The vision tower is taught to see
on small-world scenes (stage 1), so every tile is in its training distribution, and a region
question is answered from one tile's 16 visual tokens among 172.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

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


def render_mosaic(mosaic: Mosaic) -> Image.Image:
    """The 192 px image: each panel rendered as a small-world image and pasted in place."""
    canvas = Image.new("RGB", (IMAGE_PX, IMAGE_PX))
    for i, panel in enumerate(mosaic.panels):
        r, c = divmod(i, PANELS)
        canvas.paste(render(panel, PANEL_PX), (c * PANEL_PX, r * PANEL_PX))
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
