"""The six MMSpec task kinds over hires mosaics, with region questions and several samples per
image: every image is asked one question of each kind (as VQAv2 / LLaVA data ask several per
image), so a split of n samples per task holds n images, each shared by six samples.

- general / text / chart VQA: a small-world question about one named panel, or (text) which panel
  holds the sign that says a word - the answer is read from one tile;
- captioning: a sentence per panel, naming every region;
- reasoning: over two regions (objects counted in two panels, bars of two charts added);
- multi-turn: 2-3 region questions, a different panel each turn.

A sample is a function of (seed, split, index) for its image and (seed, split, task, index) for its
question. `scene_json` holds the mosaic and, per turn, the panels its answer reads (`regions`), for
the region-dependence figure of the build's report.
"""

from __future__ import annotations

import re

import numpy as np

from spec_core.reference import questions as small_q
from spec_core.reference import tasks as small
from spec_core.reference.hires import templates as T
from spec_core.reference.hires.mosaic import (PANEL_NAMES, Mosaic, mosaic_to_json,
                                              render_mosaic, sample_mosaic)
from spec_core.reference.questions import CHART, GENERAL, QA, TEXT, ask_one, pick, tens
from spec_core.reference.scenes import Scene, join_phrases, object_phrase

TASKS = small.TASKS
_IMAGE_SALT, _QUESTION_SALT = 7001, 7002   # keep hires rngs apart from the small world's


def _ask(rng: np.random.Generator, kind: str, **slots: object) -> str:
    return pick(rng, T.QUESTIONS[kind]).format(**slots)


def panel_words(text: str) -> str:
    """A small-world question or answer phrased for one panel of a mosaic."""
    return text.replace("the image", "the panel")


def in_panel(mosaic: Mosaic, p: int, rng: np.random.Generator, pool: dict,
             exclude: set[str] = frozenset()) -> tuple[str, QA]:
    """A small-world question of `pool` about panel p, phrased for the panel."""
    kind, (q, a) = ask_one(mosaic.panels[p], rng, pool, exclude)
    q = panel_words(q)
    return kind, (_ask(rng, "in_panel", panel=PANEL_NAMES[p], q=q[0].lower() + q[1:], Q=q), panel_words(a))


def sign_panel(mosaic: Mosaic, rng: np.random.Generator) -> tuple[int, QA]:
    """Which panel holds the sign that says <word>: found by content, read from one tile."""
    p = pick(rng, mosaic.where("objects", sign=True))
    word = mosaic.panels[p].sign.word
    return p, (_ask(rng, "sign_panel", word=word), T.ANSWERS["sign_panel"].format(word=word, panel=PANEL_NAMES[p]))


def _objects(scene: Scene) -> str:
    return join_phrases([f"a {object_phrase(o)}" for o in sorted(scene.objects, key=lambda o: o.cell)])


def caption(mosaic: Mosaic) -> str:
    out = [T.CAPTION["open"]]
    for name, p in zip(PANEL_NAMES, mosaic.panels):
        Panel = name[0].upper() + name[1:]
        if p.kind == "chart":
            out.append(T.CAPTION["chart"].format(Panel=Panel, n=len(p.chart.values), colour=p.chart.colour))
        elif p.sign is not None:
            out.append(T.CAPTION["sign_objects"].format(Panel=Panel, word=p.sign.word, objs=_objects(p)))
        else:
            out.append(T.CAPTION["objects"].format(Panel=Panel, objs=_objects(p)))
    return " ".join(out)


def _reason_objects(mosaic: Mosaic, rng: np.random.Generator) -> tuple[list[int], QA]:
    a, b = sorted(int(i) for i in rng.choice(mosaic.where("objects"), size=2, replace=False))
    out, counts = [], []
    for p in (a, b):
        n = len(mosaic.panels[p].objects)
        key = "panel_objects_one" if n == 1 else "panel_objects"
        out.append(T.REASONING[key].format(panel=PANEL_NAMES[p], objs=_objects(mosaic.panels[p]), n=n))
        counts.append(n)
    s = sum(counts)
    out += [T.REASONING["together"].format(a=counts[0], b=counts[1], c=s), small_q.say("answer", n=s)]
    return [a, b], (_ask(rng, "r_objects", a=PANEL_NAMES[a], b=PANEL_NAMES[b]), " ".join(out))


def _reason_charts(mosaic: Mosaic, rng: np.random.Generator) -> tuple[list[int], QA]:
    a, b = mosaic.where("chart")
    out, vals, bars = [], [], []
    for p in (a, b):
        chart = mosaic.panels[p].chart
        i = int(rng.integers(len(chart.values)))
        bars.append(chart.labels[i])
        vals.append(tens(chart.values[i]))
        out.append(T.REASONING["panel_bar"].format(panel=PANEL_NAMES[p], x=bars[-1], v=vals[-1]))
    s = sum(vals)
    out += [T.REASONING["sum"].format(a=vals[0], b=vals[1], c=s), small_q.say("answer", n=s)]
    q = _ask(rng, "r_charts", x=bars[0], y=bars[1], a=PANEL_NAMES[a], b=PANEL_NAMES[b])
    return [a, b], (q, " ".join(out))


def _region_question(mosaic: Mosaic, rng: np.random.Generator, kind: str,
                     exclude_panels: set[int] = frozenset()) -> tuple[list[int], QA]:
    """One region question of a task kind ('general_vqa' | 'text_vqa' | 'chart_vqa')."""
    if kind == "text_vqa" and rng.random() < 0.4:
        p, qa = sign_panel(mosaic, rng)
        if p not in exclude_panels:
            return [p], qa
    where = {"general_vqa": mosaic.where("objects"), "text_vqa": mosaic.where("objects", sign=True),
             "chart_vqa": mosaic.where("chart")}[kind]
    free = [p for p in where if p not in exclude_panels] or where
    p = pick(rng, free)
    pool = {"general_vqa": GENERAL, "text_vqa": TEXT, "chart_vqa": CHART}[kind]
    return [p], in_panel(mosaic, p, rng, pool)[1]


def questions(mosaic: Mosaic, task: str, rng: np.random.Generator) -> tuple[list[list[int]], list[QA]]:
    """(regions per turn, (question, answer) per turn) of one task about a mosaic."""
    if task in ("general_vqa", "text_vqa", "chart_vqa"):
        region, qa = _region_question(mosaic, rng, task)
        return [region], [qa]
    if task == "captioning":
        return [list(range(len(mosaic.panels)))], [(small_q.ask(rng, "caption"), caption(mosaic))]
    if task == "reasoning":
        region, qa = (_reason_charts if rng.random() < 0.5 else _reason_objects)(mosaic, rng)
        return [region], [qa]
    if task == "multi_turn":
        regions, turns, used = [], [], set()
        for _ in range(int(rng.integers(2, 4))):
            kind = pick(rng, ("general_vqa", "general_vqa", "text_vqa", "chart_vqa"))
            region, qa = _region_question(mosaic, rng, kind, used)
            used.update(region)
            regions.append(region)
            turns.append(qa)
        return regions, turns
    raise ValueError(f"Unknown task {task!r}; expected one of {TASKS}.")


def image_rng(index: int, seed: int, split: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), small.split_code(split), _IMAGE_SALT, int(index)])


def make_sample(index: int, task: str, seed: int, split: str) -> dict:
    """One hires sample (the small world's dict format); image `index` of the split is shared by
    the six tasks' samples of that index."""
    small.sample_rng(index, task, seed, split)  # validates task, seed and index
    qrng = np.random.default_rng([int(seed), small.split_code(split), _QUESTION_SALT, small.TASK_CODES[task], int(index)])
    mosaic = sample_mosaic(image_rng(index, seed, split))
    regions, turns = questions(mosaic, task, qrng)
    return small.sample_record(index, task, split, turns, render_mosaic(mosaic), mosaic_to_json(mosaic, regions))


def make_split(task: str, n: int, seed: int, split: str) -> list[dict]:
    """Samples 0..n-1 of one task and split (images 0..n-1, shared with the other tasks)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}.")
    return [make_sample(i, task, seed, split) for i in range(n)]


def all_words() -> frozenset[str]:
    """The small world's words and every word of the hires templates and panel names."""
    texts = [q for qs in T.QUESTIONS.values() for q in qs] + list(T.ANSWERS.values())
    texts += list(T.CAPTION.values()) + list(T.REASONING.values()) + list(T.GLUE) + list(PANEL_NAMES)
    words = {w for t in texts for w in small.words_of(re.sub(r"\{[^}]*\}", " ", t))}
    return small.all_words() | words
