"""Reference-world scenes: sampling, rendering, patch labels, texture, videos, prompts."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import ImageFont

from spec_core.reference import (BACKGROUNDS, COLOURS, SHAPES, SIZES, WORDS, Chart, Obj, Scene,
                                 Sign, describe_for_generation, describe_motion, dominant_colour,
                                 patch_labels, render, render_video, sample_motion, sample_scene,
                                 scene_dominant_colour, scene_from_json, scene_to_json)
from spec_core.reference.drawing import paint
from spec_core.reference.geometry import chart_layout, font, object_centre, sign_layout
from spec_core.reference.scenes import half_extent, sample_velocities
from spec_core.reference.vocab import COLOUR_NAMES, LETTERS


def scenes(kind: str, n: int, seed: int = 0, **kw) -> list[Scene]:
    rng = np.random.default_rng(seed)
    return [sample_scene(rng, kind, **kw) for _ in range(n)]


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_vocabulary():
    assert len(WORDS) >= 200 and list(WORDS) == sorted(set(WORDS))
    assert all(3 <= len(w) <= 6 and w.isalpha() and w.islower() for w in WORDS)
    assert len(COLOURS) >= 7 and len(SHAPES) >= 6 and len(BACKGROUNDS) >= 4
    assert not set(COLOURS) & set(BACKGROUNDS)
    assert isinstance(font(16), ImageFont.FreeTypeFont)


def test_sampling_rules():
    for s in scenes("objects", 300, seed=1):
        cells = [o.cell for o in s.objects]
        assert 1 <= len(cells) <= 5 and len(set(cells)) == len(cells)
        assert len({(o.colour, o.shape) for o in s.objects}) == len(cells)
        if s.sign is not None:
            assert all(c // 3 != s.sign.row for c in cells) and s.sign.word in WORDS
    for s in scenes("chart", 100, seed=2):
        assert 3 <= len(s.chart.values) <= 6 and all(0 <= v <= 99 for v in s.chart.values)
        assert s.chart.labels == tuple("ABCDEF"[:len(s.chart.values)])
    with pytest.raises(ValueError):
        sample_scene(np.random.default_rng(0), "video")


def test_json_roundtrip_and_render_determinism():
    for s in scenes("objects", 20, seed=3) + scenes("chart", 5, seed=3):
        assert scene_from_json(scene_to_json(s)) == s
        assert png(render(s)) == png(render(s))
        a = render(s, texture=0.5, rng=np.random.default_rng(7))
        b = render(s, texture=0.5, rng=np.random.default_rng(7))
        c = render(s, texture=0.5, rng=np.random.default_rng(8))
        assert png(a) == png(b) and png(a) != png(c)
    with pytest.raises(ValueError):
        render(s, texture=0.5)  # texture needs an explicit rng


def test_object_colour_at_its_cell_centre():
    for s in scenes("objects", 60, seed=4):
        arr = np.asarray(render(s))
        for o in s.objects:
            cx, cy = object_centre(o, 64)
            if o.shape == "ring":  # hollow: probe the band of the ring instead
                cx += 0.42 * (0.8 if o.size == "large" else 0.45) * 64 / 3
            assert tuple(arr[int(cy), int(cx)]) == COLOURS[o.colour], (o, s)


def test_patch_labels_agree_with_render():
    for s in scenes("objects", 40, seed=5):
        lab = patch_labels(s)
        assert all(lab[k].shape == (64,) for k in ("colour", "shape", "size", "cell", "char"))
        assert int(lab["count"]) == len(s.objects)
        arr, regions = paint(s, 64)
        for i, o in enumerate(s.objects):
            mask = regions == 10 + i
            assert (arr[mask] == COLOURS[o.colour]).all()
            labelled = (lab["colour"] == 1 + COLOUR_NAMES.index(o.colour)) & \
                (lab["shape"] == 1 + SHAPES.index(o.shape)) & (lab["cell"] == o.cell)
            # the patches labelled with this object hold most of its pixels (cells are 21.3 px,
            # patches 8 px, so a large object in a middle cell spills ~1 px into its neighbours) ...
            pix = np.kron(labelled.reshape(8, 8), np.ones((8, 8), dtype=bool))
            assert (mask & pix).sum() >= 0.8 * mask.sum()
            # ... and the patch it covers most is labelled with it and shows its colour
            cover = mask.reshape(8, 8, 8, 8).sum(axis=(1, 3)).ravel()
            best = int(cover.argmax())
            assert labelled[best] and lab["size"][best] == 1 + SIZES.index(o.size)
            r, c = divmod(best, 8)
            patch = arr[r * 8:r * 8 + 8, c * 8:c * 8 + 8].reshape(-1, 3)
            fg = [tuple(p) for p in patch if tuple(p) != BACKGROUNDS[s.background]]
            assert max(set(fg), key=fg.count) == COLOURS[o.colour]
        occupied = {o.cell for o in s.objects}
        assert all((lab["colour"][i] > 0) == (lab["cell"][i] in occupied) for i in range(64))
    with pytest.raises(ValueError):
        patch_labels(s, size=64, patch=7)


def test_sign_is_drawn_inside_its_band_and_labelled():
    for s in scenes("objects", 40, seed=6, with_sign_prob=1.0):
        arr = np.asarray(render(s)).astype(int)
        lay = sign_layout(s.sign, 64)
        _, y0, _, y1 = lay.band
        dark = arr.sum(-1) < 200
        band_dark = dark[y0:y1]
        assert band_dark.sum() > 20
        ys, xs = np.nonzero(band_dark)
        assert xs.min() >= 1 and xs.max() <= 62 and ys.min() >= 1 and ys.max() <= y1 - y0 - 2
        for (x0, _, x1, _) in lay.slots:  # every letter has ink in its own slot
            assert band_dark[:, int(np.ceil(x0)):int(x1)].any()
        lab = patch_labels(s)
        chars = lab["char"].reshape(8, 8)
        centres = np.arange(8) * 8 + 4
        band_rows = [r for r in range(8) if y0 <= centres[r] < y1]
        assert band_rows and (chars[[r for r in range(8) if r not in band_rows]] == 0).all()
        hit = set()
        for c, x in enumerate(centres):
            slot = [i for i, (x0, _, x1, _) in enumerate(lay.slots) if x0 <= x < x1]
            want = 1 + LETTERS.index(s.sign.word[slot[0]]) if slot else 0
            assert all(chars[r, c] == want for r in band_rows)
            hit.update(slot)
        assert hit == set(range(len(s.sign.word)))  # every letter is seen by some patch
        assert int(lab["word"]) == WORDS.index(s.sign.word)


def test_chart_bars_are_monotone_in_value():
    for s in scenes("chart", 40, seed=7):
        arr = np.asarray(render(s))
        lay = chart_layout(s.chart, 64)
        is_bar = (arr == np.array(COLOURS[s.chart.colour])).all(-1)
        heights = [is_bar[:, (x0 + x1) // 2].sum() for x0, _, x1, _ in lay.bars]
        order = np.argsort(s.chart.values)
        assert all(np.diff(np.array(heights)[order]) > 0), (heights, s.chart.values)
        lab = patch_labels(s)
        assert int(lab["n_bars"]) == len(s.chart.values)
        assert list(lab["values"][:len(s.chart.values)]) == [v // 10 for v in s.chart.values]
        assert set(lab["bar"][lab["bar"] > 0]) == set(range(1, len(s.chart.values) + 1))


def test_texture_adds_variance_but_keeps_the_dominant_colour():
    rng = np.random.default_rng(9)
    hits = 0
    for s in scenes("objects", 100, seed=9):
        clean = np.asarray(render(s)).astype(float)
        noisy_img = render(s, texture=0.6, rng=rng)
        noisy = np.asarray(noisy_img).astype(float)
        assert np.abs(np.diff(noisy, axis=1)).mean() > np.abs(np.diff(clean, axis=1)).mean() + 2
        got = dominant_colour(noisy_img, s.background)
        _, regions = paint(s, 64)
        areas = {c: sum(int((regions == 10 + i).sum()) for i, o in enumerate(s.objects)
                        if o.colour == c) for c in {o.colour for o in s.objects}}
        # equal-area objects of two colours make a tie; either answer counts
        largest = {c for c, a in areas.items() if a >= 0.95 * max(areas.values())}
        hits += got in largest
        assert dominant_colour(render(s), s.background) in largest
        assert scene_dominant_colour(s) in largest
    assert hits >= 90


def test_video_objects_move_and_stay_inside():
    rng = np.random.default_rng(10)
    for _ in range(20):
        frames = sample_motion(rng, n_frames=8)
        assert len(frames) == 8 and 1 <= len(frames[0].objects) <= 3
        for f in frames:
            for o in f.objects:
                h = half_extent(o)
                assert all(h - 1e-9 <= v <= 1 - h + 1e-9 for v in o.xy)
        for k in range(len(frames[0].objects)):
            assert frames[0].objects[k].xy != frames[1].objects[k].xy
        prompt = describe_motion(frames)
        assert all(f"{o.size} {o.colour} {o.shape}" in prompt for o in frames[0].objects)
        imgs = [np.asarray(render(f)) for f in frames]
        assert any((a != b).any() for a, b in zip(imgs, imgs[1:]))
    scene = scenes("objects", 1, seed=11, with_sign_prob=0.0)[0]
    vel = sample_velocities(rng, len(scene.objects))
    video = render_video(scene, vel, n_frames=8, texture=0.3, rng=np.random.default_rng(1))
    assert len(video) == 8 and video[0].size == (64, 64)
    with pytest.raises(ValueError):
        render_video(scene, vel + [(0.1, 0.1)], n_frames=8)


def test_prompt_names_every_object_and_background():
    for s in scenes("objects", 30, seed=12):
        p = describe_for_generation(s)
        assert p.endswith(f"on a {s.background} background")
        assert all(f"{o.size} {o.colour} {o.shape}" in p for o in s.objects)
    chart = Scene("chart", (), None, Chart(("A", "B", "C"), (10, 50, 90), "red"), "navy")
    assert describe_for_generation(chart) == "a bar chart with 3 red bars on a navy background"
    one = Scene("objects", (Obj("star", "blue", "large", 4),), Sign("apple", 0), None, "gray")
    assert describe_for_generation(one) == ("a large blue star in the center with a sign saying "
                                            "apple across the top on a gray background")
    assert scene_dominant_colour(one) == "blue"
