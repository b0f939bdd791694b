"""Short question/answer pairs about one scene: general VQA, sign reading and chart reading.
Each generator returns (question, answer) or None when the scene cannot support it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spec_core.reference.scenes import Obj, Scene, object_phrase
from spec_core.reference.templates import ANSWERS, QUESTIONS
from spec_core.reference.vocab import (CELL_PHRASES, COLOUR_NAMES, GRID, LETTERS, ROW_NAMES,
                                       SHAPES)

QA = tuple[str, str]
Generator = Callable[[Scene, np.random.Generator], "QA | None"]

RELATIONS: dict[str, tuple[int, int]] = {  # phrase -> (d_row, d_col) from the named object
    "to the left of": (0, -1), "to the right of": (0, 1), "above": (-1, 0), "below": (1, 0),
}


def pick(rng: np.random.Generator, items: list | tuple):
    """One element, uniformly."""
    return items[int(rng.integers(len(items)))]


def ask(rng: np.random.Generator, kind: str, **slots: object) -> str:
    """A paraphrase of question `kind`, chosen by rng, with its slots filled."""
    return pick(rng, QUESTIONS[kind]).format(**slots)


def say(kind: str, **slots: object) -> str:
    """The single answer template `kind` with its slots filled."""
    return ANSWERS[kind].format(**slots)


def full_ref(obj: Obj) -> str:
    """'the large red circle in the top left'."""
    return f"the {object_phrase(obj)} {CELL_PHRASES[obj.cell]}"


def tens(value: int) -> int:
    """A chart value to the nearest ten, halves up. Sampled values are 10k..10k+4, where this
    equals 10 * (value // 10), the patch-label bin."""
    return (value + 5) // 10 * 10


# ---------------------------------------------------------------- general VQA

def _colour_at(scene: Scene, rng: np.random.Generator) -> QA | None:
    if not scene.objects:
        return None
    o = pick(rng, scene.objects)
    pos = CELL_PHRASES[o.cell]
    return ask(rng, "colour_at", shape=o.shape, pos=pos), say("colour_at", shape=o.shape, pos=pos,
                                                               colour=o.colour)


def _shape_at(scene: Scene, rng: np.random.Generator) -> QA | None:
    if not scene.objects:
        return None
    o = pick(rng, scene.objects)
    pos = CELL_PHRASES[o.cell]
    return ask(rng, "shape_at", pos=pos), say("shape_at", pos=pos, shape=o.shape)


def _what_at(scene: Scene, rng: np.random.Generator) -> QA | None:
    taken = {o.cell: o for o in scene.objects}
    sign_row = -1 if scene.sign is None else scene.sign.row
    empty = [c for c in range(GRID * GRID) if c not in taken and c // GRID != sign_row]
    if taken and (not empty or rng.random() < 0.7):
        o = pick(rng, list(taken.values()))
        pos = CELL_PHRASES[o.cell]
        return ask(rng, "what_at", pos=pos), say("what_at", obj=object_phrase(o), pos=pos)
    if not empty:
        return None
    pos = CELL_PHRASES[pick(rng, empty)]
    return ask(rng, "what_at", pos=pos), say("what_at_none", pos=pos)


def _count(scene: Scene, rng: np.random.Generator) -> QA | None:
    n = len(scene.objects)
    return ask(rng, "count"), (say("count_one") if n == 1 else say("count", n=n))


def _exists(scene: Scene, rng: np.random.Generator) -> QA | None:
    present = {(o.colour, o.shape): o for o in scene.objects}
    if present and rng.random() < 0.5:
        o = pick(rng, list(present.values()))
        q = ask(rng, "exists", colour=o.colour, shape=o.shape)
        return q, say("exists_yes", colour=o.colour, shape=o.shape, pos=CELL_PHRASES[o.cell])
    absent = [(c, s) for c in COLOUR_NAMES for s in SHAPES if (c, s) not in present]
    colour, shape = pick(rng, absent)
    return ask(rng, "exists", colour=colour, shape=shape), say("exists_no", colour=colour,
                                                                shape=shape)


def neighbours(scene: Scene) -> list[tuple[Obj, str, Obj]]:
    """(anchor, relation, other): `other` sits in the cell directly `relation` the anchor."""
    by_cell = {o.cell: o for o in scene.objects}
    out = []
    for o in scene.objects:
        r, c = divmod(o.cell, GRID)
        for rel, (dr, dc) in RELATIONS.items():
            rr, cc = r + dr, c + dc
            if 0 <= rr < GRID and 0 <= cc < GRID and rr * GRID + cc in by_cell:
                out.append((o, rel, by_cell[rr * GRID + cc]))
    return out


def _relation(scene: Scene, rng: np.random.Generator) -> QA | None:
    pairs = neighbours(scene)
    if not pairs:
        return None
    anchor, rel, other = pick(rng, pairs)
    q = ask(rng, "relation", rel=rel, colour=anchor.colour, shape=anchor.shape)
    return q, say("relation", obj=object_phrase(other), rel=rel, colour=anchor.colour,
                  shape=anchor.shape)


GENERAL: dict[str, Generator] = {"colour_at": _colour_at, "shape_at": _shape_at,
                                 "what_at": _what_at, "count": _count, "exists": _exists,
                                 "relation": _relation}


# ---------------------------------------------------------------- sign reading

def _sign_word(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.sign is None:
        return None
    return ask(rng, "sign_word"), say("sign_word", word=scene.sign.word)


def _sign_where(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.sign is None:
        return None
    return ask(rng, "sign_where"), say("sign_where", row=ROW_NAMES[scene.sign.row])


def _sign_length(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.sign is None:
        return None
    w = scene.sign.word
    return ask(rng, "sign_length"), say("sign_length", word=w, n=len(w))


def _sign_first(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.sign is None:
        return None
    w = scene.sign.word
    assert w[0] in LETTERS
    return ask(rng, "sign_first"), say("sign_first", word=w, letter=w[0])


TEXT: dict[str, Generator] = {"sign_word": _sign_word, "sign_where": _sign_where,
                              "sign_length": _sign_length, "sign_first": _sign_first}


# ---------------------------------------------------------------- chart reading

def _extreme(scene: Scene, rng: np.random.Generator, kind: str) -> QA | None:
    if scene.chart is None:
        return None
    vals = scene.chart.values
    i = int(np.argmax(vals)) if kind == "tallest" else int(np.argmin(vals))
    return ask(rng, kind), say(kind, a=scene.chart.labels[i])


def _n_bars(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.chart is None:
        return None
    return ask(rng, "n_bars"), say("n_bars", n=len(scene.chart.values))


def _taller(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.chart is None:
        return None
    i, j = (int(k) for k in rng.choice(len(scene.chart.values), size=2, replace=False))
    a, b = scene.chart.labels[i], scene.chart.labels[j]
    yes = scene.chart.values[i] > scene.chart.values[j]
    return ask(rng, "taller", a=a, b=b), say("taller_yes" if yes else "taller_no", a=a, b=b)


def _bar_value(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.chart is None:
        return None
    i = int(rng.integers(len(scene.chart.values)))
    a = scene.chart.labels[i]
    return ask(rng, "bar_value", a=a), say("bar_value", a=a, v=tens(scene.chart.values[i]))


def _bar_colour(scene: Scene, rng: np.random.Generator) -> QA | None:
    if scene.chart is None:
        return None
    return ask(rng, "bar_colour"), say("bar_colour", colour=scene.chart.colour)


CHART: dict[str, Generator] = {
    "tallest": lambda s, r: _extreme(s, r, "tallest"),
    "shortest": lambda s, r: _extreme(s, r, "shortest"),
    "n_bars": _n_bars, "taller": _taller, "bar_value": _bar_value, "bar_colour": _bar_colour,
}

# Relative frequency of each question kind; the rarer ones are the easy, low-information ones.
WEIGHTS: dict[str, float] = {
    "colour_at": 2, "shape_at": 2, "what_at": 2, "count": 1.5, "exists": 1.5, "relation": 2,
    "sign_word": 3, "sign_where": 1, "sign_length": 1, "sign_first": 1,
    "tallest": 1.5, "shortest": 1.5, "n_bars": 1, "taller": 2, "bar_value": 3, "bar_colour": 0.5,
}


def ask_one(scene: Scene, rng: np.random.Generator, pool: dict[str, Generator],
            exclude: set[str] = frozenset()) -> tuple[str, QA]:
    """Pick a question kind from `pool` by WEIGHTS (skipping ones the scene cannot support or
    `exclude`), and return (kind, (question, answer))."""
    kinds = [k for k in pool if k not in exclude]
    while kinds:
        w = np.array([WEIGHTS[k] for k in kinds], dtype=np.float64)
        k = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
        qa = pool[k](scene, rng)
        if qa is not None:
            return k, qa
        kinds.remove(k)
    raise ValueError("No question of this pool fits the scene.")
