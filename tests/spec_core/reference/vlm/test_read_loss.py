"""The hires read loss (`read_loss`): what the focus heads add to the residual at a position that
predicts a word read from the image, decoded and taught that word - checked against the layer's
own attention output (all heads, an o_proj forward hook) and against o_proj on the other heads'
outputs zeroed; the pool's read positions; and a few training steps that lower it."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from spec_core.reference import hires
from spec_core.reference.hires.layout import sample_region_tokens
from spec_core.reference.hires.reads import sample_read_tokens
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import TaskPool, token_words
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import READ_WORDS, HeadOutputs, VLMTrainConfig, read_loss, train_vlm
from spec_core.reference.vocab import COLOURS, SHAPES, WORDS


def _world(read_words: frozenset[str] | None = None, tasks: tuple[str, ...] = ("general_vqa",)):
    samples = [hires.make_sample(i, t, 0, "train") for i in range(16) for t in tasks]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    size = PRESETS["tiny-hires"]
    side = size.image_size // size.patch
    pool = TaskPool.build(samples, build_processor(size, tok), size.n_image_tokens,
                          focus=lambda s: sample_region_tokens(s, side), reads=lambda s: sample_read_tokens(s, side),
                          read_words=read_words)
    return tok, size, pool


def _untrained_batch() -> tuple[torch.nn.Module, dict, torch.Tensor]:
    """An untrained tiny-hires model, a general VQA batch of 4 (without its focus) and its read_BT."""
    torch.manual_seed(0)
    tok, size, pool = _world()
    model = build_vlm(size, tok, 0).eval()
    b = pool.batch("general_vqa", 4, np.random.default_rng(0))
    read_BT = b.pop("read_BT")
    b.pop("focus_BTT")
    return model, b, read_BT


def test_read_positions_predict_words_the_image_shows():
    tok, _, pool = _world()
    n = 0
    for (_, ids, _), qs in zip(pool.examples["general_vqa"], pool.read["general_vqa"]):
        words = token_words(tok, ids)
        for q in qs:
            assert words[q + 1] in set(COLOURS) | set(SHAPES) | set(hires.all_words()) | {str(v) for v in range(0, 101, 10)}
            n += 1
    assert n > 0
    b = pool.batch("general_vqa", 4, np.random.default_rng(0))
    assert b["read_BT"].shape == b["input_ids"].shape and bool(b["read_BT"].any())


def test_read_words_keep_only_their_read_positions_and_every_read_focus():
    tasks = ("general_vqa", "text_vqa")
    tok, _, every = _world(tasks=tasks)
    _, _, signs = _world(READ_WORDS, tasks)
    kept = dropped = 0
    for task in tasks:
        for (_, ids, _), all_q, sign_q in zip(every.examples[task], every.read[task], signs.read[task]):
            words = token_words(tok, ids)
            assert sign_q == [q for q in all_q if words[q + 1] in WORDS]  # the same positions, filtered
            kept, dropped = kept + len(sign_q), dropped + len(all_q) - len(sign_q)
        for a, b in zip(every.focus[task], signs.focus[task]):  # the focus narrows for every read word still
            assert [(q.tolist(), k.tolist()) for q, k in a] == [(q.tolist(), k.tolist()) for q, k in b]
    assert kept > 0 and dropped > 0  # sign words and colours / shapes both occur


def test_the_read_loss_is_the_heads_direct_contribution_decoded():
    model, b, read_BT = _untrained_batch()
    lm = model.model.language_model
    H = model.config.text_config.num_attention_heads
    attn_out = {}
    hook = lm.layers[1].self_attn.register_forward_hook(lambda _m, _a, out: attn_out.__setitem__(1, out[0]))
    with torch.no_grad(), HeadOutputs(model, [1]) as heads_out:
        model(**b)
    hook.remove()
    q_B, q_T = read_BT[:, :-1].nonzero(as_tuple=True)
    target = b["labels"][q_B, q_T + 1]
    # every head: the layer's attention output itself
    want = F.cross_entropy(model.lm_head(lm.norm(attn_out[1][q_B, q_T])), target)
    assert torch.allclose(read_loss(model, heads_out.inputs, read_BT, b["labels"], H), want, atol=1e-5)
    # the first head: o_proj with the other heads' outputs zeroed
    x = heads_out.inputs[1].clone()
    d = x.shape[-1] // H
    x[..., d:] = 0
    want1 = F.cross_entropy(model.lm_head(lm.norm(lm.layers[1].self_attn.o_proj(x)[q_B, q_T])), target)
    assert torch.allclose(read_loss(model, heads_out.inputs, read_BT, b["labels"], 1), want1, atol=1e-5)


def test_training_with_the_read_loss_lowers_it():
    tok, size, pool = _world()
    model = build_vlm(size, tok, 0)
    cfg = VLMTrainConfig(steps=60, batch=4, warmup=5, lr=3e-3, focus_weight=1.0, focus_layers=1, focus_heads=1,
                         read_focus=True, read_weight=1.0, task_weights={"general_vqa": 1.0})
    logs = []
    out = train_vlm(model, pool, cfg, log=logs.append)
    first = float(logs[0].split(" read ")[1].split()[0])
    assert "vlm_final_read_loss" in out and out["vlm_final_read_loss"] < 0.7 * first
