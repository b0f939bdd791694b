"""processed_probs against hand computations; cached sampler vs full forwards; determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spec_core.reference.generator.bundle import GeneratorBundle
from spec_core.reference.generator.codec import fit_codec, pil_to_tensor
from spec_core.reference.generator.data import SceneSpec, image_example
from spec_core.reference.generator.layout import (SAMPLE, build_tokenizer, image_template,
                                                  make_layout)
from spec_core.reference.generator.sample import (SamplingConfig, entropy_nats, generate_images,
                                                  generate_video,
                                                  prefix_rows, processed_probs, sample_codes)
from spec_core.reference.generator.train import LMSpec, make_llama_config, new_model
from spec_core.targets.base import pad_left, text_position_ids

torch.set_num_threads(1)
PROMPTS = ["a large red circle in the center on a gray background",
           "a small blue star at the top and a large green square on the left on a navy background"]


def test_cfg_formula_temperature_and_mask():
    cond = torch.tensor([1.0, 2.0, 0.5, 3.0])
    uncond = torch.tensor([0.0, 1.0, 1.0, 9.0])
    allowed = torch.tensor([True, True, True, False])
    probs = processed_probs(cond, uncond, 2.0, 0.5, 0, 1.0, allowed)
    guided = uncond + 2.0 * (cond - uncond)  # [2, 3, 0, -3]
    want = torch.softmax(guided[:3] / 0.5, 0)
    assert torch.allclose(probs[:3], want, atol=1e-6) and probs[3] == 0
    assert math.isclose(float(probs.sum()), 1.0, abs_tol=1e-6)
    # scale 1 or no uncond: plain logits
    assert torch.allclose(processed_probs(cond, uncond, 1.0, 1.0, 0, 1.0, None),
                          torch.softmax(cond, 0))
    assert torch.allclose(processed_probs(cond, None, 3.0, 1.0, 0, 1.0, None),
                          torch.softmax(cond, 0))


def test_top_k_top_p_and_greedy():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    k2 = processed_probs(logits, None, 1.0, 1.0, 2, 1.0, None)
    assert torch.allclose(k2, torch.tensor([[0.5, 0.2, 0, 0, 0]]) / 0.7, atol=1e-6)
    # top-p 0.8: keep 0.5, 0.2 (0.7 < 0.8) and 0.15 (mass before it 0.7 < 0.8), drop the rest
    p8 = processed_probs(logits, None, 1.0, 1.0, 0, 0.8, None)
    assert torch.allclose(p8, torch.tensor([[0.5, 0.2, 0.15, 0, 0]]) / 0.85, atol=1e-6)
    p_tiny = processed_probs(logits, None, 1.0, 1.0, 0, 0.01, None)
    assert torch.equal(p_tiny, torch.tensor([[1.0, 0, 0, 0, 0]]))
    mask = torch.tensor([False, True, True, True, True])
    both = processed_probs(logits, None, 1.0, 1.0, 2, 0.5, mask)
    assert torch.allclose(both, torch.tensor([[0, 1.0, 0, 0, 0]]), atol=1e-6)
    greedy = processed_probs(logits, None, 1.0, 0.0, 0, 1.0, mask)
    assert torch.equal(greedy, torch.tensor([[0, 1.0, 0, 0, 0]]))
    assert float(entropy_nats(torch.tensor([0.5, 0.5, 0.0]))) == pytest.approx(math.log(2))


def test_processed_probs_rows_sum_to_one_inside_the_mask():
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(6, 40, generator=g), torch.randn(6, 40, generator=g)
    allowed = torch.zeros(40, dtype=torch.bool)
    allowed[10:30] = True
    probs = processed_probs(cond, uncond, 3.0, 1.3, 7, 0.9, allowed)
    assert torch.allclose(probs.sum(-1), torch.ones(6), atol=1e-6)
    assert float(probs[:, ~allowed].abs().sum()) == 0.0
    assert bool(((probs > 0).sum(-1) <= 7).all())


def test_left_pad_positions():
    ids, mask = pad_left([[5, 6, 7], [8]], 0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert text_position_ids(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.fixture(scope="module")
def bundle() -> GeneratorBundle:
    rng = np.random.default_rng(0)
    codec = fit_codec(pil_to_tensor([image_example(rng, SceneSpec())[1] for _ in range(4)]), 64,
                      2, iters=2, generator=torch.Generator().manual_seed(0))
    tok = build_tokenizer(64)
    lay = make_layout(tok, 64, (16, 16), 3, (8, 8))
    spec = LMSpec(hidden=32, layers=2, heads=2, intermediate=64)
    image_lm = new_model(make_llama_config(lay, spec, 512), 0).eval()
    video_lm = new_model(make_llama_config(lay, spec, 512), 1).eval()
    return GeneratorBundle(tok, lay, codec, image_lm, video_lm, SamplingConfig())


@torch.no_grad()
def _greedy_full_forward(b: GeneratorBundle, prompts: list[str], cfg_scale: float,
                         n_tokens: int) -> torch.Tensor:
    rows = prefix_rows(b.tokenizer, b.layout, prompts, False, cfg_scale != 1.0)
    n = len(prompts)
    out = []
    for slot in image_template(b.layout):
        if len(out) == n_tokens:
            break
        if slot != SAMPLE:  # structural token (<row_r>): forced, not sampled
            rows = [r + [slot] for r in rows]
            continue
        ids, mask = pad_left(rows, b.layout.pad)
        logits = b.image_lm(input_ids=ids, attention_mask=mask,
                            position_ids=text_position_ids(mask)).logits[:, -1]
        uncond = logits[n:] if cfg_scale != 1.0 else None
        probs = processed_probs(logits[:n], uncond, cfg_scale, 1.0, 0, 1.0,
                                b.layout.allowed_mask())
        tok = probs.argmax(-1)
        out.append(tok - b.layout.image_offset)
        rows = [r + [int(tok[i % n])] for i, r in enumerate(rows)]
    return torch.stack(out, 1)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_cached_top1_sampler_equals_full_forward_argmax(bundle, cfg_scale):
    s = SamplingConfig(temperature=1.0, top_k=1, top_p=1.0, cfg_scale=cfg_scale)
    out = sample_codes(bundle, PROMPTS, 1, False, s, torch.Generator().manual_seed(5))
    assert out.codes_BN.shape == (2, 256) and float(out.entropy_BN.abs().max()) == 0.0
    want = _greedy_full_forward(bundle, PROMPTS, cfg_scale, 24)
    assert torch.equal(out.codes_BN[:, :24], want)


def test_sampler_is_deterministic_for_a_seed(bundle):
    s = SamplingConfig(temperature=1.0, top_k=20, top_p=0.95, cfg_scale=2.0)
    a = sample_codes(bundle, PROMPTS, 2, False, s, torch.Generator().manual_seed(11))
    b = sample_codes(bundle, PROMPTS, 2, False, s, torch.Generator().manual_seed(11))
    c = sample_codes(bundle, PROMPTS, 2, False, s, torch.Generator().manual_seed(12))
    assert torch.equal(a.codes_BN, b.codes_BN) and not torch.equal(a.codes_BN, c.codes_BN)
    assert int(a.codes_BN.min()) >= 0 and int(a.codes_BN.max()) < 64
    assert float(a.entropy_BN.mean()) > 0
    # batching does not change the draws' shapes; prompt-major order
    assert a.codes_BN.shape == (4, 256)


def test_generated_images_and_videos_decode(bundle):
    g = torch.Generator().manual_seed(0)
    images = generate_images(bundle, PROMPTS, n=2, generator=g)
    assert len(images) == 4 and all(im.size == (32, 32) and im.mode == "RGB" for im in images)
    videos = generate_video(bundle, PROMPTS[:1], n=2, sampling={"cfg_scale": 1.0}, generator=g)
    assert len(videos) == 2 and all(len(v) == 3 for v in videos)
    assert all(f.size == (16, 16) for v in videos for f in v)
