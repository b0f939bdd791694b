"""Scenes of the reference world: what is in an image, how it is sampled, moved and described.

Drawing lives in `drawing.py`; its public names (render, patch_labels, render_video,
dominant_colour, scene_dominant_colour) are also reachable from this module.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from spec_core.reference.vocab import (BACKGROUND_NAMES, BAR_LABELS, CELL_PHRASES,
                                       COLOUR_NAMES, GRID, MAX_BARS, MIN_BARS, ROW_NAMES, SHAPES,
                                       SIZE_FRACTIONS, SIZES, WORDS)

KINDS: tuple[str, ...] = ("objects", "chart")
MAX_OBJECTS: int = 5


@dataclass(frozen=True)
class Obj:
    """One shape. `cell` is the 3x3 grid cell (row-major); `xy`, when set, is a continuous centre
    in [0, 1]^2 (used by videos) and `cell` is then the cell containing it."""

    shape: str
    colour: str
    size: str
    cell: int
    xy: tuple[float, float] | None = None


@dataclass(frozen=True)
class Sign:
    """A white band across the full width of grid row `row` with `word` written in black."""

    word: str
    row: int


@dataclass(frozen=True)
class Chart:
    """A bar chart: bars labelled A.. left to right with integer values in 0..99."""

    labels: tuple[str, ...]
    values: tuple[int, ...]
    colour: str


@dataclass(frozen=True)
class Scene:
    """A whole image: objects (+ optional sign) or one chart, on a muted background."""

    kind: str
    objects: tuple[Obj, ...] = field(default_factory=tuple)
    sign: Sign | None = None
    chart: Chart | None = None
    background: str = "gray"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Scene kind must be one of {KINDS}, got {self.kind!r}.")
        if self.kind == "chart" and self.chart is None:
            raise ValueError("A chart scene needs a chart.")


def cell_of(xy: tuple[float, float]) -> int:
    """Grid cell (row-major) containing a point of the unit square."""
    col = min(int(xy[0] * GRID), GRID - 1)
    row = min(int(xy[1] * GRID), GRID - 1)
    return row * GRID + col


def _sample_objects(rng: np.random.Generator, cells: list[int], lo: int,
                    hi: int) -> tuple[Obj, ...]:
    n = int(rng.integers(lo, min(hi, len(cells)) + 1))
    chosen = sorted(int(c) for c in rng.choice(cells, size=n, replace=False))
    objs: list[Obj] = []
    used: set[tuple[str, str]] = set()
    for cell in chosen:
        # Distinct (colour, shape) pairs so "the red circle" always names exactly one object.
        while True:
            colour = COLOUR_NAMES[int(rng.integers(len(COLOUR_NAMES)))]
            shape = SHAPES[int(rng.integers(len(SHAPES)))]
            if (colour, shape) not in used:
                break
        used.add((colour, shape))
        objs.append(Obj(shape, colour, SIZES[int(rng.integers(len(SIZES)))], cell))
    return tuple(objs)


def sample_chart(rng: np.random.Generator) -> Chart:
    """3-6 bars; values sit in distinct tens (10k..10k+4, k in 1..9), so every bar's value
    rounds to one unambiguous ten and no two bars look alike in height."""
    n = int(rng.integers(MIN_BARS, MAX_BARS + 1))
    tens = rng.choice(np.arange(1, 10), size=n, replace=False)
    values = tuple(int(10 * t + rng.integers(0, 5)) for t in tens)
    colour = COLOUR_NAMES[int(rng.integers(len(COLOUR_NAMES)))]
    return Chart(BAR_LABELS[:n], values, colour)


def sample_scene(rng: np.random.Generator, kind: str, with_sign_prob: float = 0.5,
                 n_objects: tuple[int, int] = (1, MAX_OBJECTS)) -> Scene:
    """Sample an "objects" scene (1-5 objects in distinct cells, maybe a sign row) or a "chart"."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    lo, hi = n_objects
    if not 1 <= lo <= hi <= MAX_OBJECTS:
        raise ValueError(f"n_objects must satisfy 1 <= lo <= hi <= {MAX_OBJECTS}, got {n_objects}.")
    background = BACKGROUND_NAMES[int(rng.integers(len(BACKGROUND_NAMES)))]
    if kind == "chart":
        return Scene("chart", (), None, sample_chart(rng), background)
    sign = None
    cells = list(range(GRID * GRID))
    if rng.random() < with_sign_prob:
        sign = Sign(WORDS[int(rng.integers(len(WORDS)))], int(rng.integers(GRID)))
        cells = [c for c in cells if c // GRID != sign.row]
    return Scene("objects", _sample_objects(rng, cells, lo, hi), sign, None, background)


def scene_to_json(scene: Scene) -> str:
    """Canonical JSON of a scene (sorted keys)."""
    return json.dumps(asdict(scene), sort_keys=True)


def scene_from_json(text: str) -> Scene:
    """Inverse of `scene_to_json`."""
    d: dict[str, Any] = json.loads(text)
    objs = tuple(Obj(o["shape"], o["colour"], o["size"], o["cell"],
                     None if o.get("xy") is None else (float(o["xy"][0]), float(o["xy"][1])))
                 for o in d["objects"])
    sign = None if d["sign"] is None else Sign(d["sign"]["word"], d["sign"]["row"])
    chart = None
    if d["chart"] is not None:
        c = d["chart"]
        chart = Chart(tuple(c["labels"]), tuple(int(v) for v in c["values"]), c["colour"])
    return Scene(d["kind"], objs, sign, chart, d["background"])


# ---------------------------------------------------------------- motion (videos)

def half_extent(obj: Obj) -> float:
    """Half the side of an object's bounding box, in unit-square coordinates."""
    return SIZE_FRACTIONS[obj.size] / GRID / 2


def _bounce(p: float, lo: float, hi: float) -> float:
    # Triangle wave: the position a point moving freely would have if it reflected off lo and hi.
    span = hi - lo
    u = (p - lo) % (2 * span)
    return lo + (2 * span - u if u > span else u)


def move_objects(scene: Scene, velocities: list[tuple[float, float]], n_frames: int) -> list[Scene]:
    """Frames of `scene` with each object moving linearly (unit-square units per frame),
    bouncing off the image borders."""
    if len(velocities) != len(scene.objects):
        raise ValueError(f"Need one velocity per object: {len(scene.objects)} objects, "
                         f"{len(velocities)} velocities.")
    if n_frames < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}.")
    frames = []
    for t in range(n_frames):
        objs = []
        for obj, (vx, vy) in zip(scene.objects, velocities):
            x0, y0 = obj.xy if obj.xy is not None else _cell_centre(obj.cell)
            h = half_extent(obj)
            xy = (_bounce(x0 + vx * t, h, 1 - h), _bounce(y0 + vy * t, h, 1 - h))
            objs.append(replace(obj, xy=xy, cell=cell_of(xy)))
        frames.append(replace(scene, objects=tuple(objs)))
    return frames


def _cell_centre(cell: int) -> tuple[float, float]:
    return ((cell % GRID + 0.5) / GRID, (cell // GRID + 0.5) / GRID)


def sample_velocities(rng: np.random.Generator, n: int) -> list[tuple[float, float]]:
    """Random directions, speeds of 4-9% of the image side per frame."""
    angles = rng.uniform(0, 2 * np.pi, n)
    speeds = rng.uniform(0.04, 0.09, n)
    return [(float(s * np.cos(a)), float(s * np.sin(a))) for a, s in zip(angles, speeds)]


def sample_motion_start(rng: np.random.Generator) -> tuple[Scene, list[tuple[float, float]]]:
    """The first frame of a video (1-3 objects at free positions) and their velocities."""
    base = sample_scene(rng, "objects", with_sign_prob=0.0, n_objects=(1, 3))
    objs = []
    for obj in base.objects:
        h = half_extent(obj)
        xy = (float(rng.uniform(h, 1 - h)), float(rng.uniform(h, 1 - h)))
        objs.append(replace(obj, xy=xy, cell=cell_of(xy)))
    return replace(base, objects=tuple(objs)), sample_velocities(rng, len(objs))


def sample_motion(rng: np.random.Generator, n_frames: int = 8) -> list[Scene]:
    """A video: 1-3 objects at free positions moving linearly and bouncing, one Scene per frame."""
    start, velocities = sample_motion_start(rng)
    return move_objects(start, velocities, n_frames)


# ---------------------------------------------------------------- prompts for the generator

def object_phrase(obj: Obj) -> str:
    """'large red circle'."""
    return f"{obj.size} {obj.colour} {obj.shape}"


def join_phrases(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def describe_for_generation(scene: Scene) -> str:
    """Short prompt: 'a large red circle in the top left and a small blue star in the center on a
    gray background' (objects in reading order), or 'a bar chart with 4 red bars on a ...'."""
    if scene.kind == "chart":
        assert scene.chart is not None
        n = len(scene.chart.values)
        return f"a bar chart with {n} {scene.chart.colour} bars on a {scene.background} background"
    objs = sorted(scene.objects, key=lambda o: o.cell)
    parts = [f"a {object_phrase(o)} {CELL_PHRASES[o.cell]}" for o in objs]
    text = join_phrases(parts) if parts else "nothing"
    if scene.sign is not None:
        text += f" with a sign saying {scene.sign.word} across the {ROW_NAMES[scene.sign.row]}"
    return f"{text} on a {scene.background} background"


def _direction(dx: float, dy: float) -> str:
    horiz = "right" if dx > 0 else "left"
    vert = "down" if dy > 0 else "up"
    if abs(dx) > 2 * abs(dy):
        return horiz
    if abs(dy) > 2 * abs(dx):
        return vert
    return f"{vert} and {horiz}"


def describe_motion(frames: list[Scene]) -> str:
    """Prompt for a video: 'a large red circle in the top left moving down and right ... on a
    gray background' (start cell and direction of the first step of each object)."""
    if len(frames) < 2:
        raise ValueError("describe_motion needs at least 2 frames.")
    parts = []
    for a, b in zip(frames[0].objects, frames[1].objects):
        assert a.xy is not None and b.xy is not None
        move = _direction(b.xy[0] - a.xy[0], b.xy[1] - a.xy[1])
        parts.append(f"a {object_phrase(a)} {CELL_PHRASES[a.cell]} moving {move}")
    return f"{join_phrases(parts)} on a {frames[0].background} background"
