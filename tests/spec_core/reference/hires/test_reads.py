"""Object-level focus of the hires world: which visual tokens show each word an answer reads
(`hires.reads`), checked against the rendered pixels, and the read pairs that narrow the focus
(`data.token_words`, `data.read_pairs`, `data.sharpen`, `TaskPool.build(reads=...)`)."""

import re

import numpy as np
import pytest

from spec_core.reference import hires
from spec_core.reference.hires.layout import sample_region_tokens, tile_of_tokens
from spec_core.reference.hires.mosaic import PANEL_PX, PANELS, mosaic_from_json, render_mosaic
from spec_core.reference.hires.reads import _patches, read_tokens, sample_read_tokens
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import (IGNORE, TaskPool, encode_conversation, read_pairs, sharpen,
                                          token_words)
from spec_core.reference.vlm.model import PRESETS, build_processor
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vocab import COLOURS

SIDE = 4  # patches per panel side (64 px panels, 16 px patches: the hires preset)


def test_patches_are_those_a_box_overlaps():
    assert np.flatnonzero(_patches((17, 17, 30, 30), SIDE)).tolist() == [5]
    assert np.flatnonzero(_patches((10, 0, 20, 5), SIDE)).tolist() == [0, 1]
    assert np.flatnonzero(_patches((16, 16, 32, 32), SIDE)).tolist() == [5]  # half-open: no edge neighbours
    assert _patches((0, 0, 64, 64), SIDE).all()


def _pixel_box(k: int) -> tuple[int, int, int, int]:
    """The image pixels of visual token k of a 192 px hires image (a tile's patch)."""
    tiles_K = tile_of_tokens(SIDE)
    p = int(tiles_K[k])
    r, c = divmod(int(np.flatnonzero(np.flatnonzero(tiles_K == p) == k)[0]), SIDE)
    pr, pc = divmod(p, PANELS)
    edge = PANEL_PX // SIDE
    return pc * PANEL_PX + c * edge, pr * PANEL_PX + r * edge, edge, edge


def test_an_objects_colour_is_read_where_the_image_shows_it_and_nowhere_else_in_its_panel():
    checked = 0
    for i in range(12):
        mosaic, _ = mosaic_from_json(hires.make_sample(i, "general_vqa", 0, "eval")["scene_json"])
        rgb = np.asarray(render_mosaic(mosaic))
        tiles_K = tile_of_tokens(SIDE)
        for p in mosaic.where("objects"):
            for colour, keys in read_tokens(mosaic, [p], SIDE).items():
                if colour not in COLOURS or any(o.colour == colour for o in mosaic.panels[p].objects) is False:
                    continue
                shows = {int(k): bool((rgb[y:y + h, x:x + w] == COLOURS[colour]).all(-1).any())
                         for k in np.flatnonzero(tiles_K == p) for x, y, w, h in [_pixel_box(int(k))]}
                assert all(shows[int(k)] for k in keys), (i, p, colour)           # every key shows it
                assert not any(v for k, v in shows.items() if k not in set(keys.tolist())), (i, p, colour)
                checked += 1
    assert checked > 30


def test_a_signs_word_and_a_bars_value_read_their_band_and_column():
    sample = next(s for i in range(40) for s in [hires.make_sample(i, "text_vqa", 0, "eval")])
    mosaic, _ = mosaic_from_json(sample["scene_json"])
    p = mosaic.where("objects", sign=True)[0]
    sign = mosaic.panels[p].sign
    keys = read_tokens(mosaic, [p], SIDE)[sign.word]
    rows = {divmod(int(np.flatnonzero(np.flatnonzero(tile_of_tokens(SIDE) == p) == k)[0]), SIDE)[0] for k in keys}
    assert len(keys) == SIDE * len(rows) and len(rows) in (1, 2)  # whole patch rows across the panel
    c = mosaic.where("chart")[0]
    chart = mosaic.panels[c].chart
    reads = read_tokens(mosaic, [c], SIDE)
    assert set(chart.labels) <= set(reads) and chart.colour in reads
    assert all(set(reads[label].tolist()) <= set(reads[chart.colour].tolist()) for label in chart.labels)
    assert set(np.flatnonzero(tile_of_tokens(SIDE) == c).tolist()) >= set(reads[chart.colour].tolist())


def test_read_pairs_point_a_word_at_its_patches_and_sharpen_replaces_the_panel_there():
    x = IGNORE
    img = 9
    #      0  1    2    3  4  5       6     7
    ids = [1, img, img, 3, 4, 20, 21, 22]
    labels = [x, x, x, x, x, 20, 21, 22]
    words = ["<s>", "<image>", "<image>", "what", "?", "it", "red", "."]
    reads = [{"red": np.array([1]), "blue": np.array([0])}]
    pairs = read_pairs(ids, labels, img, words, reads)
    assert [(q.tolist(), k.tolist()) for q, k in pairs] == [([5], [2])]  # position 5 predicts "red"
    focus = [(np.array([4, 5, 6]), np.array([1, 2]))]
    out = sharpen(focus, pairs)
    assert [(q.tolist(), k.tolist()) for q, k in out] == [([4, 6], [1, 2]), ([5], [2])]
    assert [(q.tolist(), k.tolist()) for q, k in sharpen(focus, [])] == [([4, 5, 6], [1, 2])]
    with pytest.raises(ValueError):
        read_pairs(ids, labels, img, words, reads + reads)


def _processor(samples):
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    return tok, build_processor(PRESETS["tiny-hires"], tok)


def test_token_words_join_the_pieces_of_a_word():
    samples = [hires.make_sample(i, t, 0, "train") for i in range(4) for t in ("text_vqa", "captioning")]
    tok, _ = _processor(samples)
    split = 0
    texts = [" ".join(m["content"] for m in s["conversation"] if m["role"] == "assistant") for s in samples]
    for text in texts + ["The sign says zyzzyva, the bar is 40."]:  # a word the tokenizer never saw: pieces
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        words = token_words(tok, enc["input_ids"])
        spans = [(m.start(), m.end(), m.group()) for m in re.finditer(r"\w+|[^\w\s]", text)]
        for (a, b), w in zip(enc["offset_mapping"], words):  # the word of the text holding the token's last char
            assert w == next(t for lo, hi, t in spans if lo <= b - 1 < hi), (text[a:b], w)
        split += sum(1 for i in range(1, len(words)) if words[i] == words[i - 1] == "zyzzyva")
    assert split > 0  # its pieces were joined


def test_the_pool_narrows_the_focus_of_read_words_to_their_patches():
    samples = [hires.make_sample(i, t, 0, "train") for i in range(6)
               for t in ("general_vqa", "text_vqa", "chart_vqa", "captioning")]
    tok, proc = _processor(samples)
    size = PRESETS["tiny-hires"]
    side = size.image_size // size.patch
    regions = lambda s: sample_region_tokens(s, side)  # noqa: E731
    plain = TaskPool.build(samples, proc, size.n_image_tokens, focus=regions)
    narrowed = TaskPool.build(samples, proc, size.n_image_tokens, focus=regions,
                              reads=lambda s: sample_read_tokens(s, side))
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    narrowed_queries = 0
    for task in plain.focus:
        for (_, ids, _), before, after in zip(plain.examples[task], plain.focus[task], narrowed.focus[task]):
            start = ids.index(image_id)
            panel = {int(q): set(k.tolist()) for qs, k in before for q in qs}
            now = {int(q): set(k.tolist()) for qs, k in after for q in qs}
            assert set(now) == set(panel)  # the same queries
            for q, keys in now.items():  # each keeps its panel or narrows inside it
                assert keys <= panel[q] and all(k >= start for k in keys)
                narrowed_queries += keys < panel[q]
    assert narrowed_queries > 20
    # a colour answer's word reads the patches of its object
    s = next(s for s in samples if s["task"] == "general_vqa" and "colour" in s["conversation"][0]["content"])
    ids, labels = encode_conversation(proc.tokenizer, list(s["conversation"]), size.n_image_tokens)
    words = token_words(proc.tokenizer, ids)
    pairs = read_pairs(ids, labels, image_id, words, sample_read_tokens(s, side))
    assert pairs and all(words[int(q[0]) + 1] in sample_read_tokens(s, side)[0] for q, _ in pairs)
