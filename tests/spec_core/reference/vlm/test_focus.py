"""Attention supervision of the hires target (`focus`): which positions read which image tokens,
and the loss on the attention they give them."""

import math

import numpy as np
import torch

from spec_core.reference import hires
from spec_core.reference.hires.layout import sample_region_tokens, tile_of_tokens
from spec_core.reference.hires.mosaic import PANEL_NAMES, mosaic_from_json
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.data import IGNORE, TaskPool, answer_runs, encode_conversation
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import VLMTrainConfig, focus_layers, focus_loss, train_vlm


def test_answer_runs_are_the_positions_predicting_each_turns_tokens():
    x = IGNORE
    assert answer_runs([x, x, 5, 6, x, x, 7, x]) == [[1, 2], [5]]
    assert answer_runs([x, x, x]) == []


def _processor(samples):
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    return tok, build_processor(PRESETS["tiny-hires"], tok)


def test_a_batch_focuses_each_answer_on_the_tokens_of_the_panels_it_reads():
    samples = [hires.make_sample(i, t, 0, "train") for i in range(3) for t in ("multi_turn", "captioning", "text_vqa")]
    tok, proc = _processor(samples)
    size = PRESETS["tiny-hires"]
    side = size.image_size // size.patch
    pool = TaskPool.build(samples, proc, size.n_image_tokens, focus=lambda s: sample_region_tokens(s, side))
    tiles_K = tile_of_tokens(side)
    # a caption reads every panel, one per sentence: "Top left: ..." reads the top left tile
    stop_id = tok.convert_tokens_to_ids(".")
    for (_, ids, _), pairs in zip(pool.examples["captioning"], pool.focus["captioning"]):
        assert len(pairs) == 9
        start = ids.index(tok.convert_tokens_to_ids("<image>"))
        for p, (q, k) in enumerate(pairs):
            sentence = tok.decode([ids[i + 1] for i in q]).strip()
            assert sentence.lower().startswith(PANEL_NAMES[p] + ":") and sentence.endswith(".")
            assert ids[q[-1] + 1] == stop_id and stop_id not in [ids[i + 1] for i in q[:-1]]
            assert set(tiles_K[k - start]) == {p} and len(k) == side * side
    b = pool.batch("multi_turn", 6, np.random.default_rng(1))
    image_id = tok.convert_tokens_to_ids("<image>")
    for row in range(6):
        ids = b["input_ids"][row].tolist()
        match = [s for s in samples if s["task"] == "multi_turn"
                 and encode_conversation(tok, list(s["conversation"]), size.n_image_tokens)[0] == ids[:len(_ids(tok, s))]]
        s = match[0]
        labels = b["labels"][row].tolist()
        start = ids.index(image_id)
        regions = mosaic_from_json(s["scene_json"])[1]
        turn_of = {}
        for t, run in enumerate(answer_runs(labels)):
            turn_of.update({q: t for q in run})
        for q in range(len(ids)):
            keys = set(torch.nonzero(b["focus_BTT"][row, q]).flatten().tolist())
            if q not in turn_of:
                assert not keys
                continue
            assert {int(tiles_K[k - start]) for k in keys} == set(regions[turn_of[q]])
            assert len(keys) == side * side * len(set(regions[turn_of[q]]))


def _ids(tok, s):
    return encode_conversation(tok, list(s["conversation"]), PRESETS["tiny-hires"].n_image_tokens)[0]


def test_focus_loss_is_minus_log_the_mass_on_the_keys_in_the_supervised_heads_only():
    B, H, T = 2, 3, 6
    focus_BTT = torch.zeros(B, T, T, dtype=torch.bool)
    focus_BTT[:, 4, 1:3] = True  # position 4 should read positions 1 and 2
    on_keys = torch.zeros(B, H, T, T)
    on_keys[..., 1:3] = 0.5
    uniform = torch.full((B, H, T, T), 1 / T)
    assert focus_loss((on_keys,), focus_BTT, heads=2).item() < 1e-6
    assert math.isclose(focus_loss((uniform,), focus_BTT, heads=2).item(), math.log(T / 2), rel_tol=1e-5)
    assert math.isclose(focus_loss((on_keys, uniform), focus_BTT, heads=2).item(), math.log(T / 2) / 2, rel_tol=1e-5)
    mixed = on_keys.clone()
    mixed[:, 2] = uniform[:, 2]  # an unsupervised head reads what it likes
    assert focus_loss((mixed,), focus_BTT, heads=2).item() < 1e-6
    assert focus_loss((mixed,), torch.zeros_like(focus_BTT), heads=2).item() == 0.0
    assert focus_layers(10, 2) == [4, 5] and focus_layers(4, 2) == [1, 2] and focus_layers(2, 3) == [0, 1]


def _probe_focus_loss(model, probe: dict, heads: int) -> float:
    """The focus loss of a fixed batch, eager attention, no grad (the model's attention restored)."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    batch = dict(probe)
    focus_BTT = batch.pop("focus_BTT")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    model.set_attn_implementation(impl)
    return focus_loss([out.attentions[i] for i in focus_layers(len(out.attentions), 2)], focus_BTT, heads).item()


def test_attention_weights_of_the_focus_layers_only_match_eager_everywhere_and_are_restored():
    """Eager on two layers, SDPA (on the float mask) elsewhere: the same logits and the same
    weights of those layers as eager in every layer, on a right-padded batch; then sdpa again."""
    from spec_core.reference.vlm.train import attention_weights_of

    samples = [hires.make_sample(i, t, 0, "train") for i in range(3) for t in ("captioning", "multi_turn")]
    tok, proc = _processor(samples)
    size = PRESETS["tiny-hires"]
    pool = TaskPool.build(samples, proc, size.n_image_tokens)
    batch = pool.batch("multi_turn", 3, np.random.default_rng(0))
    assert not bool(batch["attention_mask"].all())  # padded
    model = build_vlm(size, tok, 0).eval()
    layers = focus_layers(model.config.text_config.num_hidden_layers, 2)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = model(**batch, output_attentions=True)
    model.set_attn_implementation("sdpa")
    with attention_weights_of(model, layers), torch.no_grad():
        out = model(**batch, output_attentions=True)
    assert len(out.attentions) == len(layers)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(out.attentions[i], ref.attentions[layer], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=1e-4)
    assert model.config._attn_implementation == "sdpa"
    assert all(m.config._attn_implementation == "sdpa" for m in model.modules()
               if type(m).__name__.endswith("Attention"))


def test_training_with_focus_teaches_the_heads_to_read_the_panel_and_keeps_sdpa_for_the_saved_model():
    samples = [hires.make_sample(i, "text_vqa", 0, "train") for i in range(6)]
    tok, proc = _processor(samples)
    size = PRESETS["tiny-hires"]
    side = size.image_size // size.patch
    pool = TaskPool.build(samples, proc, size.n_image_tokens, focus=lambda s: sample_region_tokens(s, side))
    probe = pool.batch("text_vqa", 6, np.random.default_rng(3))
    losses = {}
    for weight in (0.0, 1.0):
        model = build_vlm(size, tok, 0)
        impl = model.config._attn_implementation
        before = _probe_focus_loss(model, probe, 2)
        cfg = VLMTrainConfig(steps=25, batch=2, warmup=2, lr=3e-3, task_weights={"text_vqa": 1.0}, focus_weight=weight)
        m = train_vlm(model, pool, cfg)
        assert model.config._attn_implementation == impl
        assert ("vlm_final_focus_loss" in m) == (weight > 0)
        losses[weight] = (before, _probe_focus_loss(model, probe, 2))
    assert losses[0.0][0] == losses[1.0][0]  # the same initial model
    # taught, the supervised heads put far more of their attention on the panel than untaught
    assert losses[1.0][1] < 0.7 * losses[1.0][0] and losses[1.0][1] < 0.7 * losses[0.0][1], losses


def test_a_hires_build_with_focus_trains_it_and_saves_an_sdpa_model(tmp_path, monkeypatch):
    """build_target passes each sample's region tokens when the preset's focus weight is set, and
    its question's content words when the copy weight is."""
    import dataclasses

    from spec_core.reference.vlm import build as build_mod
    from spec_core.reference.vlm.train import TRAIN_PRESETS

    preset = dataclasses.replace(TRAIN_PRESETS["tiny-hires"], focus_weight=1.0, copy_weight=1.0,
                                 steps=4, train_per_task=2)
    monkeypatch.setitem(build_mod.TRAIN_PRESETS, "tiny-hires", preset)
    metrics = build_mod.build_target("tiny-hires", str(tmp_path), seed=0)
    assert metrics["vlm_final_focus_loss"] > 0 and metrics["vlm_final_copy_loss"] > 0
    assert build_mod.load_target(str(tmp_path))[0].config._attn_implementation == "sdpa"
