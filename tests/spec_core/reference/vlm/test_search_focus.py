"""The focus loss on the search positions (`search_weight`): an answer word read from the image
that its question does not name, found by what the question says to look for (`search_pairs`'
queries). The pool marks exactly those positions (`search_BT`), the config refuses the option where
there is nothing to mark, and training with it focuses those positions more than without."""

import numpy as np
import pytest
import torch

from spec_core.reference import hires
from spec_core.reference.hires.layout import sample_region_tokens
from spec_core.reference.hires.mosaic import PANEL_NAMES
from spec_core.reference.hires.reads import sample_read_tokens
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import TaskPool, content_token_ids, search_pairs, token_words
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import VLMTrainConfig, attention_weights_of, focus_layers, focus_loss, train_vlm
from spec_core.reference.vocab import CONTENT_WORDS


def _pool(samples, search: bool):
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    size = PRESETS["tiny-hires"]
    side = size.image_size // size.patch
    proc = build_processor(size, tok)
    pool = TaskPool.build(samples, proc, size.n_image_tokens, focus=lambda s: sample_region_tokens(s, side),
                          copy_words=CONTENT_WORDS, reads=lambda s: sample_read_tokens(s, side, answers=True),
                          search=search)
    return tok, size, pool


def test_the_pool_marks_the_search_positions_and_each_is_a_focus_position():
    samples = [s for i in range(40) for s in [hires.make_sample(i, "text_vqa", 0, "train")]
               if "that says" in s["answers"][0]][:4]
    tok, _, pool = _pool(samples, search=True)
    content = content_token_ids(tok, CONTENT_WORDS)
    for s, (_, ids, labels), marked in zip(samples, pool.examples["text_vqa"], pool.search["text_vqa"]):
        words = token_words(tok, ids)
        shown = sample_read_tokens(s, PRESETS["tiny-hires"].image_size // PRESETS["tiny-hires"].patch, answers=True)
        assert marked == [int(q[0]) for q, _ in search_pairs(ids, labels, words, content, shown)]
        # "The sign that says X is in the bottom left panel.": the positions predicting the panel's name
        panel = s["answers"][0].split(" is in the ")[1].split()[:-1]
        assert [words[q + 1] for q in marked] == panel and " ".join(panel) in PANEL_NAMES
    b = pool.batch("text_vqa", 3, np.random.default_rng(0))
    assert b["search_BT"].any() and b["focus_BTT"].any(-1)[b["search_BT"]].all()
    assert _pool(samples, search=False)[2].search is None


def test_search_weight_needs_the_focus_the_copy_words_and_the_reads():
    for bad in (dict(), dict(focus_weight=1.0, copy_weight=1.0), dict(focus_weight=1.0, read_focus=True)):
        with pytest.raises(ValueError, match="search_weight"):
            VLMTrainConfig(search_weight=1.0, **bad)
    VLMTrainConfig(search_weight=1.0, focus_weight=1.0, copy_weight=1.0, read_focus=True)


def test_training_with_search_weight_focuses_the_search_positions_more():
    samples = [hires.make_sample(i, "general_vqa", 0, "train") for i in range(16)]
    tok, size, pool = _pool(samples, search=True)
    probe = pool.batch("general_vqa", 8, np.random.default_rng(1))
    search_BTT = probe.pop("focus_BTT") & probe.pop("search_BT")[:, :, None]
    for k in ("copy_BTT", "read_BT"):
        probe.pop(k)
    assert search_BTT.any()
    after = {}
    for weight in (0.0, 10.0):
        model = build_vlm(size, tok, 0)
        cfg = VLMTrainConfig(steps=40, batch=4, warmup=5, lr=3e-3, focus_weight=1.0, focus_layers=1, focus_heads=1,
                             copy_weight=1.0, read_focus=True, search_weight=weight,
                             task_weights={"general_vqa": 1.0})
        out = train_vlm(model, pool, cfg)
        assert ("vlm_final_search_loss" in out) == (weight > 0)
        layer = focus_layers(size.text_layers, 1)
        with torch.no_grad(), attention_weights_of(model, layer):
            attn = model(**probe, output_attentions=True).attentions
        after[weight] = focus_loss(list(attn), search_BTT, 1).item()
    assert after[10.0] < 0.8 * after[0.0], after
