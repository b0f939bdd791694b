"""The hires read loss (`read_loss`): what the focus heads add to the residual at a position that
predicts a word read from the image, decoded and taught that word - checked against the layer's
own attention output (all heads, an o_proj forward hook) and against o_proj on the other heads'
outputs zeroed; the pool's read positions; and a few training steps that lower it. With the
attention held fixed (`read_values_only`): the same value, and no gradient to the layer's queries
and keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spec_core.reference import hires
from spec_core.reference.hires.layout import sample_region_tokens
from spec_core.reference.hires.reads import sample_read_tokens
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import TaskPool, token_words
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import (READ_KINDS, READ_LOSS_WORDS, HeadOutputs, VLMTrainConfig,
                                           attention_weights_of, heads_read, read_heads_of, read_loss, read_words_of,
                                           train_vlm)
from spec_core.reference.vocab import COLOURS, SHAPES, WORDS


def _world(read_words: frozenset[str] | dict[str, int] | None = None, tasks: tuple[str, ...] = ("general_vqa",)):
    samples = [hires.make_sample(i, t, 0, "train") for i in range(16) for t in tasks]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    size = PRESETS["tiny-hires"]
    side = size.image_size // size.patch
    pool = TaskPool.build(samples, build_processor(size, tok), size.n_image_tokens,
                          focus=lambda s: sample_region_tokens(s, side), reads=lambda s: sample_read_tokens(s, side),
                          read_words=read_words)
    return tok, size, pool


def _untrained_batch(read_words=None, n: int = 4) -> tuple[torch.nn.Module, dict, torch.Tensor]:
    """An untrained tiny-hires model, a general VQA batch of n (without its focus) and its read_BT."""
    torch.manual_seed(0)
    tok, size, pool = _world(read_words)
    model = build_vlm(size, tok, 0).eval()
    b = pool.batch("general_vqa", n, np.random.default_rng(0))
    read_BT = b.pop("read_BT")
    b.pop("focus_BTT")
    return model, b, read_BT


def test_read_positions_predict_words_the_image_shows():
    tok, _, pool = _world()
    n = 0
    for (_, ids, _), qs in zip(pool.examples["general_vqa"], pool.read["general_vqa"]):
        words = token_words(tok, ids)
        for q, k in qs:
            assert k == 0  # one kind: every read word
            assert words[q + 1] in set(COLOURS) | set(SHAPES) | set(hires.all_words()) | {str(v) for v in range(0, 101, 10)}
            n += 1
    assert n > 0
    b = pool.batch("general_vqa", 4, np.random.default_rng(0))
    assert b["read_BT"].shape == b["input_ids"].shape and bool(b["read_BT"].any())


def test_read_words_keep_only_their_read_positions_and_every_read_focus():
    tasks = ("general_vqa", "text_vqa")
    tok, _, every = _world(tasks=tasks)
    _, _, signs = _world(READ_LOSS_WORDS["signs"], tasks)
    kept = dropped = 0
    for task in tasks:
        for (_, ids, _), all_q, sign_q in zip(every.examples[task], every.read[task], signs.read[task]):
            words = token_words(tok, ids)
            assert sign_q == [(q, k) for q, k in all_q if words[q + 1] in WORDS]  # the same positions, filtered
            kept, dropped = kept + len(sign_q), dropped + len(all_q) - len(sign_q)
        for a, b in zip(every.focus[task], signs.focus[task]):  # the focus narrows for every read word still
            assert [(q.tolist(), k.tolist()) for q, k in a] == [(q.tolist(), k.tolist()) for q, k in b]
    assert kept > 0 and dropped > 0  # sign words and colours / shapes both occur
    assert READ_LOSS_WORDS["all"] is None
    with pytest.raises(ValueError, match="read_loss_words"):
        VLMTrainConfig(read_loss_words="sign")
    with pytest.raises(ValueError, match="copy_reads"):  # nothing would be taught: a no-op fails instead
        VLMTrainConfig(copy_reads=True, read_focus=True)
    VLMTrainConfig(copy_reads=True, copy_weight=1.0, read_focus=True)


def test_by_kind_every_read_word_has_its_kind_and_its_own_heads():
    """"by_kind": a sign's word, a colour, a shape or bar value each keep their kind (READ_KINDS),
    a bar's label (which shares its patches with the value) is no read position; the config asks
    for as many focus heads as the kinds read from."""
    cfg = VLMTrainConfig(read_loss_words="by_kind", focus_heads=4)
    tasks = ("general_vqa", "text_vqa", "chart_vqa")
    tok, _, pool = _world(read_words_of(cfg), tasks)
    seen = set()
    for task in tasks:
        for (_, ids, _), qs in zip(pool.examples[task], pool.read[task]):
            words = token_words(tok, ids)
            for q, k in qs:
                assert words[q + 1] in READ_KINDS[k][0]
                seen.add(k)
    assert seen == {0, 1, 2}
    assert read_heads_of(cfg) == [(0, 2), (2, 1), (3, 1)] and read_heads_of(VLMTrainConfig()) == [(0, 2)]
    with pytest.raises(ValueError, match="focus_heads"):
        VLMTrainConfig(read_loss_words="by_kind")  # 2 focus heads: the fourth kind's head is not one


def test_each_kind_is_decoded_from_its_own_heads():
    """Two kinds on a 2-head decoder, colours on head 0 and shapes on head 1: the loss is the mean
    over both kinds' positions of o_proj with every other head's output zeroed, decoded."""
    model, b, read_BT = _untrained_batch({**{c: 0 for c in COLOURS}, **{s: 1 for s in SHAPES}}, 6)
    assert set(read_BT.unique().tolist()) == {0, 1, 2}
    lm = model.model.language_model
    with torch.no_grad(), HeadOutputs(model, [1]) as heads_out:
        model(**b)
    x = heads_out.inputs[1]
    d = x.shape[-1] // model.config.text_config.num_attention_heads
    logits, targets = [], []
    for k in (0, 1):
        only = torch.zeros_like(x)
        only[..., k * d: (k + 1) * d] = x[..., k * d: (k + 1) * d]
        q_B, q_T = (read_BT[:, :-1] == k + 1).nonzero(as_tuple=True)
        logits.append(model.lm_head(lm.norm(lm.layers[1].self_attn.o_proj(only)[q_B, q_T])))
        targets.append(b["labels"][q_B, q_T + 1])
    want = F.cross_entropy(torch.cat(logits), torch.cat(targets))
    got = read_loss(model, heads_out.inputs, read_BT, b["labels"], [(0, 1), (1, 1)])
    assert torch.allclose(got, want, atol=1e-5)
    one_head = read_loss(model, heads_out.inputs, read_BT.bool().long(), b["labels"], 1)  # both kinds on head 0
    assert not torch.allclose(got, one_head, atol=1e-3)


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


@pytest.mark.parametrize("values_only", [False, True])
def test_training_with_the_read_loss_lowers_it(values_only):
    tok, size, pool = _world()
    model = build_vlm(size, tok, 0)
    cfg = VLMTrainConfig(steps=60, batch=4, warmup=5, lr=3e-3, focus_weight=1.0, focus_layers=1, focus_heads=1,
                         read_focus=True, read_weight=1.0, task_weights={"general_vqa": 1.0},
                         read_values_only=values_only)
    logs = []
    out = train_vlm(model, pool, cfg, log=logs.append)
    first = float(logs[0].split(" read ")[1].split()[0])
    assert "vlm_final_read_loss" in out and out["vlm_final_read_loss"] < 0.7 * first


def test_heads_read_is_the_attention_times_each_heads_value_head():
    """4 query heads on 2 value heads (GQA): head h reads value head h // 2."""
    g = torch.Generator().manual_seed(0)
    B, H, T, KV, d = 2, 4, 5, 2, 3
    attn = torch.rand(B, H, T, T, generator=g).softmax(-1)
    v = torch.randn(B, T, KV * d, generator=g)
    q_B, q_T = torch.tensor([0, 1, 1]), torch.tensor([4, 2, 0])
    got = heads_read(attn, v, q_B, q_T, 1, 2, d)  # heads 1 and 2: value heads 0 and 1
    for p, (b, t) in enumerate(zip(q_B.tolist(), q_T.tolist())):
        want = torch.cat([attn[b, h, t] @ v[b, :, (h // 2) * d: (h // 2 + 1) * d] for h in (1, 2)])
        assert torch.allclose(got[p], want, atol=1e-6)


def test_read_values_only_keeps_the_loss_and_stops_its_gradient_to_where_the_heads_look():
    model, b, read_BT = _untrained_batch()
    attn = model.model.language_model.layers[1].self_attn
    grads = {}
    for fixed_attention in (False, True):
        model.zero_grad(set_to_none=True)
        with attention_weights_of(model, [1]), HeadOutputs(model, [1], values=fixed_attention) as heads_out:
            out = model(**b, output_attentions=True)
            fixed = ({1: out.attentions[0]}, heads_out.values) if fixed_attention else None
            loss = read_loss(model, heads_out.inputs, read_BT, b["labels"], 1, fixed)
        loss.backward()
        grads[fixed_attention] = (loss.item(), attn.q_proj.weight.grad, attn.v_proj.weight.grad)
    assert grads[True][0] == pytest.approx(grads[False][0], abs=1e-5)
    assert grads[False][1].abs().sum() > 0
    assert grads[True][1] is None or not grads[True][1].any()
    assert grads[True][2].abs().sum() > 0  # what the heads read still learns


def test_read_values_only_needs_the_read_loss():
    with pytest.raises(ValueError, match="read_values_only"):
        VLMTrainConfig(read_values_only=True)
    VLMTrainConfig(read_values_only=True, read_focus=True, read_weight=1.0)
