"""Reference-world tasks: determinism, sample format, and answers that agree with the scene."""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from spec_core.reference import (IMAGE_TOKEN, TASKS, all_words, corpus_texts, make_sample,
                                 make_split, render, scene_from_json, words_of)
from spec_core.reference.scenes import Scene
from spec_core.reference.tasks import png_bytes
from spec_core.reference.vocab import CELL_PHRASES, ROW_NAMES

N = 200


@pytest.fixture(scope="module")
def samples() -> dict[str, list[dict]]:
    return {t: make_split(t, N, seed=0, split="train") for t in TASKS}


def n_words(text: str) -> int:
    return len(text.split())


def test_determinism_and_ids():
    a = make_sample(3, "captioning", 0, "train")
    assert a == make_sample(3, "captioning", 0, "train")
    b = make_sample(4, "captioning", 0, "train")
    c = make_sample(3, "captioning", 0, "eval")
    assert a["id"] == "train-captioning-000003" and c["id"] == "eval-captioning-000003"
    assert len({a["image_sha256"], b["image_sha256"], c["image_sha256"]}) == 3
    assert make_sample(3, "captioning", 1, "train")["image_sha256"] != a["image_sha256"]
    with pytest.raises(ValueError):
        make_sample(0, "ocr", 0, "train")


def test_same_bytes_in_a_fresh_process():
    code = ("from spec_core.reference import make_sample; "
            "print(make_sample(5, 'multi_turn', 3, 'eval')['image_sha256'])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == make_sample(5, "multi_turn", 3, "eval")["image_sha256"]


def test_sample_format(samples):
    for task, rows in samples.items():
        for s in rows[:50]:
            assert s["task"] == task and s["split"] == "train"
            assert hashlib.sha256(s["image_png"]).hexdigest() == s["image_sha256"]
            scene = scene_from_json(s["scene_json"])
            assert png_bytes(render(scene)) == s["image_png"]
            assert Image.open(io.BytesIO(s["image_png"])).size == (64, 64)
            conv = s["conversation"]
            assert [t["role"] for t in conv] == ["user", "assistant"] * (len(conv) // 2)
            assert conv[0]["content"].startswith(IMAGE_TOKEN)
            assert all(IMAGE_TOKEN not in t["content"] for t in conv[1:])
            assert s["answers"] == [t["content"] for t in conv[1::2]]
    kinds = {t: {scene_from_json(s["scene_json"]).kind for s in rows}
             for t, rows in samples.items()}
    assert kinds["chart_vqa"] == {"chart"} and kinds["reasoning"] == {"chart", "objects"}
    assert kinds["general_vqa"] == kinds["captioning"] == kinds["text_vqa"] == {"objects"}
    assert all(scene_from_json(s["scene_json"]).sign for s in samples["text_vqa"])


def check_general(scene: Scene, q: str, a: str) -> None:
    """Parse a short objects answer back and check it against the scene."""
    by_pos = {CELL_PHRASES[o.cell]: o for o in scene.objects}
    pos_re = "|".join(CELL_PHRASES)
    if m := re.fullmatch(r"There (?:are (\d+) objects|is 1 object)\.", a):
        assert int(m.group(1) or 1) == len(scene.objects)
    elif m := re.fullmatch(rf"The (\w+) ({pos_re}) is (\w+)\.", a):
        o = by_pos[m.group(2)]
        assert (o.shape, o.colour) == (m.group(1), m.group(3))
    elif m := re.fullmatch(rf"The object ({pos_re}) is a (\w+)\.", a):
        assert by_pos[m.group(1)].shape == m.group(2)
    elif m := re.fullmatch(rf"There is a (\w+) (\w+) (\w+) ({pos_re})\.", a):
        o = by_pos[m.group(4)]
        assert (o.size, o.colour, o.shape) == m.group(1, 2, 3)
    elif m := re.fullmatch(rf"There is nothing ({pos_re})\.", a):
        assert m.group(1) not in by_pos
    elif m := re.fullmatch(rf"Yes, there is a (\w+) (\w+) ({pos_re})\.", a):
        o = by_pos[m.group(3)]
        assert (o.colour, o.shape) == m.group(1, 2)
    elif m := re.fullmatch(r"No, there is no (\w+) (\w+)\.", a):
        assert (m.group(1), m.group(2)) not in {(o.colour, o.shape) for o in scene.objects}
    elif m := re.fullmatch(r"The (\w+) (\w+) (\w+) is directly (.+) the (\w+) (\w+)\.", a):
        other = next(o for o in scene.objects if (o.colour, o.shape) == m.group(2, 3))
        anchor = next(o for o in scene.objects if (o.colour, o.shape) == m.group(5, 6))
        d = {"to the left of": -1, "to the right of": 1, "above": -3, "below": 3}[m.group(4)]
        assert other.cell == anchor.cell + d and other.size == m.group(1)
    elif m := re.fullmatch(r"The sign says (\w+)\.", a):
        assert m.group(1) == scene.sign.word
    elif m := re.fullmatch(r"The sign is across the (\w+) of the image\.", a):
        assert ROW_NAMES.index(m.group(1)) == scene.sign.row
    elif m := re.fullmatch(r"The word (\w+) (?:has (\d) letters|starts with the letter (\w))\.", a):
        w = scene.sign.word
        assert m.group(1) == w and (m.group(2) is None or int(m.group(2)) == len(w))
        assert m.group(3) is None or m.group(3) == w[0]
    else:
        check_chart(scene, q, a)


def check_chart(scene: Scene, q: str, a: str) -> None:
    """Parse a short chart answer back and check it against the chart."""
    ch = scene.chart
    assert ch is not None, (q, a)
    val = dict(zip(ch.labels, ch.values))
    if m := re.fullmatch(r"Bar (\w) is the (tallest|shortest)\.", a):
        pick = max if m.group(2) == "tallest" else min
        assert m.group(1) == pick(val, key=val.get)
    elif m := re.fullmatch(r"The chart has (\d) bars\.", a):
        assert int(m.group(1)) == len(ch.values)
    elif m := re.fullmatch(r"(Yes|No), bar (\w) is (taller|shorter) than bar (\w)\.", a):
        assert (val[m.group(2)] > val[m.group(4)]) == (m.group(1) == "Yes")
        assert (m.group(3) == "taller") == (m.group(1) == "Yes")
    elif m := re.fullmatch(r"Bar (\w) is about (\d+)\.", a):
        assert int(m.group(2)) == round(val[m.group(1)] / 10) * 10
    elif m := re.fullmatch(r"The bars are (\w+)\.", a):
        assert m.group(1) == ch.colour
    else:
        raise AssertionError(f"unparsed answer {a!r} to {q!r}")


@pytest.mark.parametrize("task", ["general_vqa", "text_vqa", "chart_vqa", "multi_turn"])
def test_short_answers_match_the_scene(samples, task):
    for s in samples[task]:
        scene = scene_from_json(s["scene_json"])
        qs = [t["content"] for t in s["conversation"][::2]]
        for q, a in zip(qs, s["answers"]):
            check_general(scene, q, a)


def test_multi_turn_has_two_or_three_distinct_turns(samples):
    counts = [len(s["answers"]) for s in samples["multi_turn"]]
    assert set(counts) == {2, 3}
    for s in samples["multi_turn"]:
        qs = [t["content"] for t in s["conversation"][::2]]
        assert len(set(qs)) == len(qs)


def test_caption_lists_everything_and_has_the_right_length(samples):
    lengths = []
    for s in samples["captioning"]:
        scene, cap = scene_from_json(s["scene_json"]), s["answers"][0]
        lengths.append(n_words(cap))
        for o in scene.objects:
            assert f"there is a {o.size} {o.colour} {o.shape}." in cap
        assert scene.background in cap and (scene.sign is None or scene.sign.word in cap)
    assert np.mean([40 <= n <= 150 for n in lengths]) >= 0.9


def expected_reasoning(scene: Scene, q: str) -> int:
    """Recompute a reasoning answer from the question text and the scene."""
    if scene.kind == "chart":
        val = {a: round(v / 10) * 10 for a, v in zip(scene.chart.labels, scene.chart.values)}
        bars = re.findall(r"\b[A-F]\b", q)
        if "taller" in q or "exceed" in q:
            return val[bars[0]] - val[bars[1]]
        if len(bars) == 4:
            return abs(val[bars[0]] + val[bars[1]] - val[bars[2]] - val[bars[3]])
        return sum(val[b] for b in bars)
    objs = scene.objects
    if m := re.search(r"not (\w+)", q):
        return sum(o.colour != m.group(1) for o in objs)
    colour, shapes = re.search(r"number of (\w+) objects .*number of (\w+)", q).groups()
    k = sum(o.colour == colour for o in objs)
    n = sum(o.shape + ("es" if o.shape == "cross" else "s") == shapes for o in objs)
    return abs(k - n) if ("difference" in q or "apart" in q) else k + n


def test_reasoning_is_correct_and_long_enough(samples):
    lengths = []
    for s in samples["reasoning"]:
        scene, a = scene_from_json(s["scene_json"]), s["answers"][0]
        q = s["conversation"][0]["content"]
        m = re.search(r"The answer is (\d+)\.$", a)
        assert m, a
        assert int(m.group(1)) == expected_reasoning(scene, q[len(IMAGE_TOKEN):]), (q, a)
        lengths.append(n_words(a))
    assert np.mean([60 <= n <= 250 for n in lengths]) >= 0.9


def test_vocabulary_covers_every_text(samples):
    vocab = all_words()
    texts = list(corpus_texts(r for rows in samples.values() for r in rows))
    assert len(texts) >= 2 * N * len(TASKS)
    assert not any(t.startswith("<image>") for t in texts)
    missing = {w for t in texts for w in words_of(t)} - vocab
    assert not missing
