"""The six MMSpec task kinds over reference-world scenes, and deterministic sample generation.

Every answer is a function of the scene alone (built from one template per answer kind);
questions get rng-chosen paraphrases. A sample is fully determined by (seed, split, task, index).
"""

from __future__ import annotations

import hashlib
import io
import re
import zlib
from collections.abc import Iterable, Iterator

import numpy as np
from PIL import Image

from spec_core.reference import templates
from spec_core.reference.drawing import render
from spec_core.reference.questions import (CHART, GENERAL, QA, RELATIONS, TEXT, ask, ask_one,
                                           full_ref, pick, say, tens)
from spec_core.reference.scenes import (Scene, join_phrases, object_phrase, sample_scene,
                                        scene_to_json)
from spec_core.reference.templates import CAPTION, REASONING
from spec_core.reference.vocab import (BACKGROUND_NAMES, BAR_LABELS, CELL_PHRASES, COLOUR_NAMES,
                                       GRID, LETTERS, ROW_NAMES, SHAPE_PLURALS, SHAPES, SIZES,
                                       WORDS)

TASKS: tuple[str, ...] = ("general_vqa", "text_vqa", "captioning", "chart_vqa", "reasoning",
                          "multi_turn")
TASK_CODES: dict[str, int] = {t: i for i, t in enumerate(TASKS)}
SPLIT_CODES: dict[str, int] = {"train": 0, "eval": 1, "val": 2, "test": 3}
IMAGE_TOKEN = "<image>\n"
IMAGE_SIZE = 64
MAX_NUMBER = 300  # largest number any answer can contain (3 bars of at most 90 -> 270)


# ---------------------------------------------------------------- single-turn tasks

def general_vqa(scene: Scene, rng: np.random.Generator) -> QA:
    """One attribute / relation / counting question about an objects scene."""
    return ask_one(scene, rng, GENERAL)[1]


def text_vqa(scene: Scene, rng: np.random.Generator) -> QA:
    """One question about the sign (mostly: which word it shows)."""
    if scene.sign is None:
        raise ValueError("text_vqa needs a scene with a sign.")
    return ask_one(scene, rng, TEXT)[1]


def chart_vqa(scene: Scene, rng: np.random.Generator) -> QA:
    """One question about the bar chart."""
    if scene.chart is None:
        raise ValueError("chart_vqa needs a chart scene.")
    return ask_one(scene, rng, CHART)[1]


def caption(scene: Scene) -> str:
    """Detailed description: count, sign, per-row summary, each object in reading order,
    colours, background."""
    objs = sorted(scene.objects, key=lambda o: o.cell)
    n, bg, sign = len(objs), scene.background, scene.sign
    key = ("open_sign" if sign else "open") + ("_one" if n == 1 else "")
    out = [CAPTION[key].format(n=n, bg=bg)]
    if sign is not None:
        out.append(CAPTION["sign"].format(row=ROW_NAMES[sign.row], word=sign.word))
    for r in range(GRID):
        k = sum(o.cell // GRID == r for o in objs)
        if sign is not None and sign.row == r:
            out.append(CAPTION["row_sign"].format(row=ROW_NAMES[r]))
        else:
            key = "row_none" if k == 0 else "row_one" if k == 1 else "row_many"
            out.append(CAPTION[key].format(row=ROW_NAMES[r], n=k))
    for o in objs:
        pos = CELL_PHRASES[o.cell]
        out.append(CAPTION["object"].format(Pos=pos[0].upper() + pos[1:], obj=object_phrase(o)))
    colours = list(dict.fromkeys(o.colour for o in objs))
    if len(colours) == 1:
        out.append(CAPTION["colours_one"].format(colour=colours[0]))
    else:
        out.append(CAPTION["colours"].format(colours=join_phrases(colours)))
    out.append(CAPTION["close"].format(bg=bg))
    return " ".join(out)


def captioning(scene: Scene, rng: np.random.Generator) -> QA:
    """'Describe the image in detail.' (paraphrased) -> `caption(scene)`."""
    return ask(rng, "caption"), caption(scene)


# ---------------------------------------------------------------- reasoning

def _listing(objs: list, many: str, one: str, none: str, **slots: object) -> str:
    refs = [full_ref(o) for o in objs]
    key = none if not refs else one if len(refs) == 1 else many
    return REASONING[key].format(objs=join_phrases(refs), **slots)


def _objects_reasoning(scene: Scene, rng: np.random.Generator) -> QA:
    objs = sorted(scene.objects, key=lambda o: o.cell)
    kind = pick(rng, ("r_sum", "r_diff", "r_not"))
    # Mostly ask about attributes that are present, so the worked answer has something to list.
    colour = pick(rng, objs).colour if rng.random() < 0.8 else pick(rng, COLOUR_NAMES)
    shape = pick(rng, objs).shape if rng.random() < 0.8 else pick(rng, SHAPES)
    shapes = SHAPE_PLURALS[shape]
    by_colour = [o for o in objs if o.colour == colour]
    by_shape = [o for o in objs if o.shape == shape]
    n, k, m = len(objs), len(by_colour), len(by_shape)
    intro = "all_objects_one" if n == 1 else "all_objects"
    out = [REASONING[intro].format(n=n, objs=join_phrases([full_ref(o) for o in objs]))]
    colour_list = _listing(by_colour, "colour_many", "colour_one", "colour_none", colour=colour)
    if kind == "r_not":
        out += [REASONING["first_all"].format(n=n), REASONING["next_colour"].format(colour=colour),
                colour_list, REASONING["makes"].format(n=k),
                REASONING["not"].format(colour=colour, a=n, b=k, c=n - k)]
        result = n - k
    else:
        out += [REASONING["first_colour"].format(colour=colour), colour_list,
                REASONING["makes"].format(n=k), REASONING["next_shapes"].format(shapes=shapes),
                _listing(by_shape, "shapes_many", "shapes_one", "shapes_none", shape=shape,
                         shapes=shapes),
                REASONING["makes"].format(n=m)]
        if kind == "r_sum":
            result = k + m
            out.append(REASONING["plus"].format(a=k, b=m, c=result))
        else:
            result = abs(k - m)
            out.append(REASONING["diff"].format(a=max(k, m), b=min(k, m), c=result))
    out.append(say("answer", n=result))
    return ask(rng, kind, colour=colour, shapes=shapes), " ".join(out)


def _bar_names(labels: list[str]) -> str:
    return join_phrases([f"bar {a}" for a in labels])


def _chart_reasoning(scene: Scene, rng: np.random.Generator) -> QA:
    assert scene.chart is not None
    labels, vals = scene.chart.labels, [tens(v) for v in scene.chart.values]
    kinds = ["r_sum2", "r_sum3", "r_bar_diff"] + (["r_totals"] if len(vals) >= 4 else [])
    kind = pick(rng, kinds)
    n_pick = {"r_sum2": 2, "r_sum3": 3, "r_bar_diff": 2, "r_totals": 4}[kind]
    idx = [int(i) for i in rng.choice(len(vals), size=n_pick, replace=False)]
    if kind != "r_totals":
        idx.sort()
    if kind == "r_bar_diff":
        idx.sort(key=lambda i: -vals[i])  # ask how much the taller exceeds the shorter
    names = [labels[i] for i in idx]
    out = [REASONING["chart_open"].format(n=len(vals), colour=scene.chart.colour,
                                         labels=join_phrases(list(labels)))]
    out += [REASONING["bar"].format(a=a, v=v) for a, v in zip(labels, vals)]
    out.append(REASONING["needs"].format(bars=_bar_names(names)))
    out += [REASONING["bar"].format(a=labels[i], v=vals[i]) for i in idx]
    if kind in ("r_sum2", "r_sum3"):
        result = sum(vals[i] for i in idx)
        terms = " plus ".join(str(vals[i]) for i in idx)
        out.append(REASONING["sum"].format(terms=terms, s=result))
    elif kind == "r_bar_diff":
        a, b = idx
        result = vals[a] - vals[b]
        out.append(REASONING["minus"].format(a=labels[a], va=vals[a], vb=vals[b], d=result))
    else:
        s1, s2 = vals[idx[0]] + vals[idx[1]], vals[idx[2]] + vals[idx[3]]
        for which, (i, j), s in (("first", idx[:2], s1), ("second", idx[2:], s2)):
            out.append(REASONING["total"].format(which=which, a=labels[i], b=labels[j],
                                                 va=vals[i], vb=vals[j], s=s))
        result = abs(s1 - s2)
        if s1 == s2:
            out.append(REASONING["equal"])
        else:
            big, small = max(s1, s2), min(s1, s2)
            which = "first" if s1 > s2 else "second"
            out.append(REASONING["larger"].format(which=which, s1=big, s2=small, d=result))
    out.append(say("answer", n=result))
    q = ask(rng, kind, **dict(zip("abcd", names)))
    return q, " ".join(out)


def reasoning(scene: Scene, rng: np.random.Generator) -> QA:
    """Multi-step counting (objects) or bar arithmetic (charts), worked step by step, ending
    with 'The answer is N.'."""
    return _chart_reasoning(scene, rng) if scene.kind == "chart" else _objects_reasoning(scene, rng)


def multi_turn(scene: Scene, rng: np.random.Generator) -> list[QA]:
    """2-3 short questions of different kinds about one image."""
    pool = CHART if scene.kind == "chart" else GENERAL | (TEXT if scene.sign else {})
    used: set[str] = set()
    turns = []
    for _ in range(int(rng.integers(2, 4))):
        kind, qa = ask_one(scene, rng, pool, exclude=used)
        used.add(kind)
        turns.append(qa)
    return turns


# ---------------------------------------------------------------- samples

_SINGLE = {"general_vqa": general_vqa, "text_vqa": text_vqa, "captioning": captioning,
           "chart_vqa": chart_vqa, "reasoning": reasoning}


def split_code(split: str) -> int:
    """Stable integer for a split name (fixed for the usual names, CRC32 for others)."""
    if not isinstance(split, str) or not split:
        raise ValueError(f"split must be a non-empty string, got {split!r}.")
    return SPLIT_CODES.get(split, 1000 + zlib.crc32(split.encode()))


def sample_rng(index: int, task: str, seed: int, split: str) -> np.random.Generator:
    """The generator behind one sample, from (seed, split, task, index) only."""
    if task not in TASK_CODES:
        raise ValueError(f"Unknown task {task!r}; expected one of {TASKS}.")
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}.")
    return np.random.default_rng([int(seed), split_code(split), TASK_CODES[task], int(index)])


def scene_for_task(task: str, rng: np.random.Generator) -> Scene:
    """Sample the kind of scene a task asks about."""
    if task == "chart_vqa" or (task == "reasoning" and rng.random() < 0.5) or \
            (task == "multi_turn" and rng.random() < 0.25):
        return sample_scene(rng, "chart")
    if task == "text_vqa":
        return sample_scene(rng, "objects", with_sign_prob=1.0)
    if task == "reasoning":  # >= 2 objects so the worked answer has something to count
        return sample_scene(rng, "objects", with_sign_prob=0.3, n_objects=(2, 5))
    return sample_scene(rng, "objects", with_sign_prob=0.3 if task == "general_vqa" else 0.5)


def png_bytes(image: Image.Image) -> bytes:
    """PNG encoding with fixed options (no metadata), so equal images give equal bytes."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def make_sample(index: int, task: str, seed: int, split: str) -> dict:
    """One benchmark sample as a plain dict (id, task, split, image_png, image_sha256,
    conversation, answers, scene_json); deterministic in (seed, split, task, index)."""
    rng = sample_rng(index, task, seed, split)
    scene = scene_for_task(task, rng)
    turns = multi_turn(scene, rng) if task == "multi_turn" else [_SINGLE[task](scene, rng)]
    return sample_record(index, task, split, turns, render(scene, IMAGE_SIZE), scene_to_json(scene))


def conversation_of(turns: list[QA]) -> list[dict]:
    """Chat messages of (question, answer) turns; the image opens the first user turn."""
    out = []
    for i, (q, a) in enumerate(turns):
        out += [{"role": "user", "content": (IMAGE_TOKEN if i == 0 else "") + q}, {"role": "assistant", "content": a}]
    return out


def sample_record(index: int, task: str, split: str, turns: list[QA], image: Image.Image, scene_json: str) -> dict:
    """The sample dict of any reference world: the image opens the first user turn."""
    conversation = conversation_of(turns)
    png = png_bytes(image)
    return {"id": f"{split}-{task}-{index:06d}", "task": task, "split": split, "image_png": png,
            "image_sha256": hashlib.sha256(png).hexdigest(), "conversation": conversation,
            "answers": [a for _, a in turns], "scene_json": scene_json}


def make_split(task: str, n: int, seed: int, split: str) -> list[dict]:
    """Samples 0..n-1 of one task and split."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}.")
    return [make_sample(i, task, seed, split) for i in range(n)]


def corpus_texts(samples: Iterable[dict]) -> Iterator[str]:
    """Every question and answer text of the samples (the image placeholder stripped)."""
    for s in samples:
        for turn in s["conversation"]:
            text = turn["content"]
            yield text[len(IMAGE_TOKEN):] if text.startswith(IMAGE_TOKEN) else text


_WORD_RE = re.compile(r"[a-z0-9]+")


def words_of(text: str) -> list[str]:
    """Lowercase runs of letters/digits: the word notion `all_words` is defined with."""
    return _WORD_RE.findall(text.lower())


def all_words() -> frozenset[str]:
    """Every word (per `words_of`) that can appear in any question or answer."""
    texts: list[str] = [q for qs in templates.QUESTIONS.values() for q in qs]
    texts += list(templates.ANSWERS.values()) + list(CAPTION.values())
    texts += list(REASONING.values()) + list(templates.GLUE)
    texts += list(COLOUR_NAMES) + list(BACKGROUND_NAMES) + list(SHAPES) + list(SIZES)
    texts += list(SHAPE_PLURALS.values()) + list(CELL_PHRASES) + list(ROW_NAMES) + list(WORDS)
    texts += list(RELATIONS) + list(BAR_LABELS) + list(LETTERS)
    words = {w for t in texts for w in words_of(re.sub(r"\{[^}]*\}", " ", t))}
    return frozenset(words | {str(i) for i in range(MAX_NUMBER + 1)})
