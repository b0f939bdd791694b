"""Training, save/reload with from_pretrained, and the tiny end-to-end build."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from spec_core.reference.drawing import OBJECT_REGION, paint, render
from spec_core.reference.generator.build import (GeneratorBuildConfig, build_generator,
                                                 evaluate_generator, load_generator)
from spec_core.reference.generator.codec import fit_codec, pil_to_tensor
from spec_core.reference.generator.data import SceneSpec, image_example, sample_image_scene
from spec_core.reference.generator.layout import build_tokenizer, make_layout
from spec_core.reference.generator.sample import generate_images, generate_video
from spec_core.reference.generator.train import (LMSpec, image_batch, init_code_embeddings,
                                                 lm_loss, make_llama_config, new_model,
                                                 object_codes, train_lm, video_batch)

torch.set_num_threads(1)


def _setup():
    rng = np.random.default_rng(0)
    spec = SceneSpec()
    codec = fit_codec(pil_to_tensor([image_example(rng, spec)[1] for _ in range(4)]), 64, 2,
                      iters=2, generator=torch.Generator().manual_seed(0))
    tok = build_tokenizer(64)
    return rng, spec, codec, tok, make_layout(tok, 64, (16, 16), 8, (8, 8))


def test_batches_mask_everything_but_image_codes():
    rng, spec, codec, tok, lay = _setup()
    b = image_batch(rng, spec, codec, tok, lay, 3, 0.0)
    lo, hi = lay.image_token_range
    labels = b["labels"]
    assert int((labels != -100).sum(1).min()) == 256 and int((labels != -100).sum(1).max()) == 256
    assert bool(((labels == -100) | ((labels >= lo) & (labels < hi))).all())
    assert not bool(((labels >= lay.row0) & (labels < lay.row0 + 16)).any())  # forced row starts
    v = video_batch(rng, spec, codec, tok, lay, 2, 1.0)  # dropout 1: empty prompts
    assert v["input_ids"].shape == (2, 2 + 8 * (8 * 9 + 1) + 2)
    assert int((v["labels"] != -100).sum()) == 2 * 512


def test_tiny_lm_trains_saves_and_reloads_identically(tmp_path):
    rng, spec, codec, tok, lay = _setup()
    lm = LMSpec(hidden=32, layers=2, heads=2, intermediate=64, steps=4, batch_size=2, warmup=1)
    model = new_model(make_llama_config(lay, lm, 512), 0)
    before = [p.detach().clone() for p in model.parameters()]
    stats = train_lm(model, lambda step: image_batch(rng, spec, codec, tok, lay, 2, 0.1), lm,
                     lay, progress=False)
    assert stats["steps"] == 4 and np.isfinite(stats["final_loss_ema"])
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    model.save_pretrained(str(tmp_path))
    loaded = LlamaForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).eval()
    ids = image_batch(np.random.default_rng(1), spec, codec, tok, lay, 2, 0.0)
    with torch.no_grad():
        a = model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits
        b = loaded(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits
    assert torch.equal(a, b)


def test_noise_draw_targets():
    rng, spec, codec, tok, lay = _setup()
    b = image_batch(rng, spec, codec, tok, lay, 2, 0.0, noise_draws=4)
    draws = b["draw_codes_BTR"]
    assert draws.shape == (2, 256, 4)
    lo, _ = lay.image_token_range
    valid = b["labels"] != -100
    assert torch.equal(b["labels"][valid].view(2, 256) - lo, draws[..., 0])
    assert bool((draws[..., 0] != draws[..., 1]).any())  # fresh pixel noise per draw
    model = new_model(make_llama_config(lay, LMSpec(hidden=32, layers=1, heads=2,
                                                    intermediate=64), 512), 0)
    with torch.no_grad():
        same = dict(b, draw_codes_BTR=draws[..., :1].repeat(1, 1, 3))
        hard = {k: v for k, v in b.items() if k != "draw_codes_BTR"}
        assert torch.allclose(lm_loss(model, same, lay), lm_loss(model, hard, lay), atol=1e-5)
        # histogram target = mean of the per-draw one-hot losses
        per_draw = []
        for r in range(4):
            labels = b["labels"].clone()
            labels[valid] = draws[..., r].reshape(-1) + lo
            per_draw.append(lm_loss(model, dict(hard, labels=labels), lay))
        assert torch.allclose(lm_loss(model, b, lay), torch.stack(per_draw).mean(), atol=1e-5)


def test_object_codes_and_weighted_loss():
    rng, spec, codec, tok, lay = _setup()
    b = image_batch(rng, spec, codec, tok, lay, 3, 0.0)
    obj = b["object_BL"]
    assert obj.shape == b["labels"].shape and not bool(obj[b["labels"] == -100].any())
    assert 0 < int(obj.sum()) < int((b["labels"] != -100).sum())
    # oracle: the painted region map (patches at least half covered by an object), with a
    # codebook fitted on these images (the 4-image one of _setup misses some backgrounds)
    scenes = [sample_image_scene(rng, spec) for _ in range(8)]
    images = [render(sc, 32, spec.texture, rng) for sc in scenes]
    fitted = fit_codec(pil_to_tensor(images), 64, 2, iters=4,
                       generator=torch.Generator().manual_seed(0))
    got = object_codes(fitted, fitted.encode_pil(images), [sc.background for sc in scenes])
    regions = torch.tensor(np.stack([paint(sc, 32)[1] for sc in scenes]) >= OBJECT_REGION)
    want = regions.float().unfold(1, 2, 2).unfold(2, 2, 2).mean((-1, -2)).flatten(1) >= 0.5
    both = float((got & want).sum())
    assert both / float(want.sum()) > 0.8 and both / float(got.sum()) > 0.8
    model = new_model(make_llama_config(lay, LMSpec(hidden=32, layers=1, heads=2,
                                                    intermediate=64), 512), 0)
    with torch.no_grad():
        plain = lm_loss(model, b, lay)
        assert torch.allclose(lm_loss(model, b, lay, 1.0), plain)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2),
                                               b["labels"][:, 1:], reduction="none")
        valid, is_obj = b["labels"][:, 1:] != -100, obj[:, 1:]
        want = (ce[valid].sum() + 4 * ce[is_obj].sum()) / (valid.sum() + 4 * is_obj.sum())
        assert torch.allclose(lm_loss(model, b, lay, 5.0), want, atol=1e-5)
        assert torch.allclose(ce[valid].mean(), plain, atol=1e-5)


def test_code_embedding_init_is_structured():
    _, _, codec, tok, lay = _setup()
    model = new_model(make_llama_config(lay, LMSpec(hidden=32, layers=1, heads=2,
                                                    intermediate=64), 512), 0)
    init_code_embeddings(model, codec, lay, tok, seed=0)
    lo, hi = lay.image_token_range
    emb = model.get_input_embeddings().weight[lo:hi].detach()
    d_emb = torch.cdist(emb, emb).flatten()
    d_code = torch.cdist(codec.codebook_KD, codec.codebook_KD).flatten()
    assert float(torch.corrcoef(torch.stack([d_emb, d_code]))[0, 1]) > 0.5


def test_init_is_seeded():
    _, _, _, _, lay = _setup()
    cfg = make_llama_config(lay, LMSpec(hidden=32, layers=1, heads=2, intermediate=64), 512)
    a, b = new_model(cfg, 3), new_model(cfg, 3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.slow  # a build, then images and videos sampled and the evaluation: ~6 s
def test_tiny_build_completes_and_reloads(tmp_path):
    cfg = GeneratorBuildConfig.preset("tiny")
    start = time.perf_counter()
    metrics = build_generator(cfg, tmp_path, progress=False)
    assert time.perf_counter() - start < 30
    for key in ("codec_seconds", "image_lm_train_seconds", "video_lm_train_seconds",
                "total_seconds"):
        assert key in metrics
    data = json.loads((tmp_path / "image_lm" / "generator_config.json").read_text())
    assert data["default_sampling"]["top_k"] == cfg.default_sampling.top_k
    assert data["image_token_range"][1] - data["image_token_range"][0] >= 512
    bundle = load_generator(tmp_path)
    assert bundle.image_lm is not None and bundle.video_lm is not None
    assert bundle.codec.codebook_size >= 512 and len(bundle.tokenizer) == bundle.layout.vocab_size
    g = torch.Generator().manual_seed(0)
    assert generate_images(bundle, ["a large red circle in the center on a gray background"],
                           n=1, generator=g)[0].size == (32, 32)
    frames = generate_video(bundle, ["a small red star moving up from the top on a gray background"],
                            n=1, generator=g)[0]
    assert len(frames) == 8 and frames[0].size == (16, 16)
    single = load_generator(tmp_path / "video_lm")
    assert single.video_lm is not None and single.image_lm is None
    metrics = evaluate_generator(tmp_path, cfg)
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["video_frames"] == 8.0 and metrics["codec_psnr_image"] > 15
