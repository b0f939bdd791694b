"""The hires world's data: 192 px mosaics of nine small-world panels, six task kinds of region
questions, six samples per image; answers checked against the panel each turn says it reads."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from spec_core.reference import TASKS, render, words_of
from spec_core.reference.hires import (IMAGE_PX, PANEL_NAMES, PANEL_PX, all_words, make_sample, make_split,
                                       mosaic_from_json, render_mosaic, sample_mosaic)
from spec_core.reference.hires.mosaic import FRAME_PX, FRAME_RGB, alter_panel, frame_panel
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import decode_png

N = 40


@pytest.fixture(scope="module")
def samples() -> dict[str, list[dict]]:
    return {t: make_split(t, N, seed=0, split="train") for t in TASKS}


def test_every_image_is_asked_one_question_of_each_kind_and_samples_are_deterministic(samples):
    for i in range(N):
        shas = {samples[t][i]["image_sha256"] for t in TASKS}
        assert len(shas) == 1, i  # six samples share image i
    assert len({samples["captioning"][i]["image_sha256"] for i in range(N)}) == N  # images differ
    assert make_sample(5, "reasoning", 0, "train") == samples["reasoning"][5]
    assert make_sample(5, "reasoning", 0, "eval")["image_sha256"] != samples["reasoning"][5]["image_sha256"]
    assert make_sample(5, "reasoning", 1, "train")["image_sha256"] != samples["reasoning"][5]["image_sha256"]
    assert samples["text_vqa"][7]["id"] == "train-text_vqa-000007"
    with pytest.raises(ValueError, match="Unknown task"):
        make_sample(0, "ocr", 0, "train")


def test_the_image_is_the_nine_panels_each_drawn_as_a_small_world_scene_inside_a_frame(samples):
    s = samples["captioning"][3]
    image = np.asarray(decode_png(s["image_png"]))
    assert image.shape == (IMAGE_PX, IMAGE_PX, 3)
    ring = np.zeros((IMAGE_PX, IMAGE_PX), dtype=bool)
    ring[:FRAME_PX], ring[-FRAME_PX:], ring[:, :FRAME_PX], ring[:, -FRAME_PX:] = True, True, True, True
    assert (image[ring] == FRAME_RGB).all()
    mosaic, _ = mosaic_from_json(s["scene_json"])
    for i, panel in enumerate(mosaic.panels):
        r, c = divmod(i, 3)
        cut = np.s_[r * PANEL_PX:(r + 1) * PANEL_PX, c * PANEL_PX:(c + 1) * PANEL_PX]
        inside = ~ring[cut]
        assert np.array_equal(image[cut][inside], np.asarray(render(panel, PANEL_PX))[inside]), PANEL_NAMES[i]
        # what stage 1 of the tower trains on is the tile, pixel for pixel
        assert np.array_equal(image[cut], np.asarray(frame_panel(render(panel, PANEL_PX), i))), PANEL_NAMES[i]
    # the frame is the only magenta: a tile's place is told by its framed sides alone
    assert not (image[~ring] == FRAME_RGB).all(-1).any()


def test_region_answers_are_read_from_the_panel_they_name(samples):
    lookups = 0
    for s in samples["text_vqa"] + samples["chart_vqa"] + samples["general_vqa"]:
        mosaic, regions = mosaic_from_json(s["scene_json"])
        [[p]] = regions
        q, a = s["conversation"][0]["content"], s["answers"][0]
        panel = mosaic.panels[p]
        if s["task"] == "chart_vqa":
            assert panel.kind == "chart" and PANEL_NAMES[p] + " panel" in q
        elif s["task"] == "general_vqa":
            assert panel.kind == "objects" and PANEL_NAMES[p] + " panel" in q
        elif PANEL_NAMES[p] + " panel" in a:  # which panel holds the sign that says <word>
            lookups += 1
            assert panel.sign.word in q and sum(p.sign is not None and p.sign.word in q for p in mosaic.panels) == 1
        else:
            assert panel.sign is not None and PANEL_NAMES[p] + " panel" in q
    assert 0 < lookups < N


def test_captions_name_every_panel_and_reasoning_reads_two(samples):
    for s in samples["captioning"]:
        mosaic, regions = mosaic_from_json(s["scene_json"])
        assert regions == [list(range(9))]
        for name, panel in zip(PANEL_NAMES, mosaic.panels):
            line = next(x for x in s["answers"][0].split(". ") if x.lower().startswith(name + ":"))
            for o in panel.objects:
                assert f"{o.size} {o.colour} {o.shape}" in line
            if panel.sign is not None:
                assert panel.sign.word in line
    for s in samples["reasoning"]:
        mosaic, [[a, b]] = mosaic_from_json(s["scene_json"])
        answer = s["answers"][0]
        if mosaic.panels[a].kind == "objects":
            n = len(mosaic.panels[a].objects) + len(mosaic.panels[b].objects)
        else:
            bars = [int(v) for v in answer.split("Adding them, ")[1].split(" is ")[0].split(" plus ")]
            n = sum(bars)
        assert answer.endswith(f"The answer is {n}.")
        assert PANEL_NAMES[a] in answer and PANEL_NAMES[b] in answer


def test_multi_turn_reads_a_different_panel_each_turn(samples):
    for s in samples["multi_turn"]:
        _, regions = mosaic_from_json(s["scene_json"])
        assert 2 <= len(regions) == len(s["answers"]) <= 3
        panels = [r[0] for r in regions]
        assert len(set(panels)) == len(panels)


def test_every_word_of_the_corpus_is_in_all_words(samples):
    words = all_words()
    for text in corpus_texts(s for group in samples.values() for s in group):
        assert set(words_of(text)) <= words, text


def test_a_redrawn_panel_changes_that_tile_only():
    rng = np.random.default_rng(0)
    mosaic = sample_mosaic(rng)
    for p in range(9):
        altered = alter_panel(mosaic, p, rng)
        before, after = np.asarray(render_mosaic(mosaic)), np.asarray(render_mosaic(altered))
        r, c = divmod(p, 3)
        changed = np.any(before != after, axis=-1)
        assert changed[r * PANEL_PX:(r + 1) * PANEL_PX, c * PANEL_PX:(c + 1) * PANEL_PX].any()
        changed[r * PANEL_PX:(r + 1) * PANEL_PX, c * PANEL_PX:(c + 1) * PANEL_PX] = False
        assert not changed.any()
        assert altered.panels[p].kind == mosaic.panels[p].kind
        assert (altered.panels[p].sign is None) == (mosaic.panels[p].sign is None)


def test_scene_json_round_trips():
    s = make_sample(2, "multi_turn", 0, "eval")
    mosaic, regions = mosaic_from_json(s["scene_json"])
    assert json.loads(s["scene_json"])["regions"] == regions
    assert Image.open(io.BytesIO(s["image_png"])).tobytes() == render_mosaic(mosaic).tobytes()
