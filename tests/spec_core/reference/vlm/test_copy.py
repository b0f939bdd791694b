"""Copy supervision of the hires target: an answer word that repeats a content word of its own
turn's question is taught to read it there (`copy_pairs`, `copy_BTT`, `copy_weight`)."""

import numpy as np
import torch

from spec_core.reference import hires
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import IGNORE, TaskPool, content_token_ids, copy_pairs
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import VLMTrainConfig, copy_layer, focus_loss, train_vlm
from spec_core.reference.vocab import CONTENT_WORDS

CROSS, BLUE, EOS = 10, 11, 2


def test_copy_pairs_point_a_repeated_word_at_its_own_turns_question_only():
    x = IGNORE
    #        0  1      2  3  4      5     6    | 7  8     9  10 11    12
    ids = [1, CROSS, 3, 4, CROSS, BLUE, EOS, 5, BLUE, 3, 6, BLUE, CROSS]
    labels = [x, x, x, x, CROSS, BLUE, EOS, x, x, x, x, BLUE, CROSS]
    pairs = copy_pairs(ids, labels, frozenset({CROSS, BLUE}))
    # turn 1 copies "cross" (its "blue" is read, not copied); turn 2 copies "blue" from its own
    # question, and its "cross" stands only in turn 1's question: not a copy of turn 2's
    assert [(q.tolist(), k.tolist()) for q, k in pairs] == [([3], [1]), ([10], [8])]
    assert copy_pairs(ids, labels, frozenset()) == []


def _processor(samples):
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    return tok, build_processor(PRESETS["tiny-hires"], tok)


def test_content_tokens_are_the_shape_colour_and_sign_words_only():
    samples = [hires.make_sample(i, "general_vqa", 0, "train") for i in range(4)]
    tok, _ = _processor(samples)
    ids = content_token_ids(tok, CONTENT_WORDS)
    assert {tok.decode([i]).strip().lower() for i in ids} <= CONTENT_WORDS
    whole = [tok.encode(" " + w, add_special_tokens=False) for w in sorted(CONTENT_WORDS)]
    whole = {e[0] for e in whole if len(e) == 1}  # words the tokenizer holds as one token
    assert len(whole) > 20 and whole <= ids
    assert not set(tok.encode(" the panel", add_special_tokens=False)) & ids


def _probe_copy_loss(model, probe: dict, head: int) -> float:
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    batch = {k: v for k, v in probe.items() if not k.endswith("_BTT")}
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    model.set_attn_implementation(impl)
    layer = copy_layer(len(out.attentions), 2)
    return focus_loss([out.attentions[layer]], probe["copy_BTT"], 1, first=head).item()


def test_training_with_copy_teaches_its_head_to_read_the_questions_word():
    samples = [hires.make_sample(i, t, 0, "train") for i in range(6) for t in ("general_vqa", "text_vqa")]
    tok, proc = _processor(samples)
    size = PRESETS["tiny-hires"]
    pool = TaskPool.build(samples, proc, size.n_image_tokens, copy_words=CONTENT_WORDS)
    assert pool.focus is None and sum(len(p) for p in pool.copy["text_vqa"]) > 0
    probe = pool.batch("text_vqa", 6, np.random.default_rng(3))
    assert probe["copy_BTT"].any()
    head = size.text_heads - 1  # the head after the focus heads, the last of tiny's two
    losses = {}
    for weight in (0.0, 1.0):
        model = build_vlm(size, tok, 0)
        before = _probe_copy_loss(model, probe, head)
        cfg = VLMTrainConfig(steps=25, batch=2, warmup=2, lr=3e-3,
                             task_weights={"general_vqa": 1.0, "text_vqa": 1.0}, copy_weight=weight)
        m = train_vlm(model, pool, cfg)
        assert ("vlm_final_copy_loss" in m) == (weight > 0) and "vlm_final_focus_loss" not in m
        losses[weight] = (before, _probe_copy_loss(model, probe, head))
    assert losses[0.0][0] == losses[1.0][0]
    assert losses[1.0][1] < 0.7 * losses[1.0][0] and losses[1.0][1] < 0.7 * losses[0.0][1], losses
