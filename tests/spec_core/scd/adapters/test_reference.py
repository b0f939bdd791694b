"""The reference-world generator behind the Jacobi decoder: greedy SCD equals the generator's own
AR sampler (images and video, with CFG), bodies decode to pixels, bad prompts get reasons."""

from __future__ import annotations

import pytest
import torch

from spec_core.reference.generator import GeneratorBuildConfig, build_generator, load_generator, sample_codes
from spec_core.scd import JacobiDecoder, ScdConfig
from spec_core.scd.adapters import adapter_for
from spec_core.scd.adapters.reference import ReferenceGenerator

PROMPTS = ["a gray background with a large red circle in the center",
           "a small blue star moving up from the top on a gray background"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("gen")
    build_generator(GeneratorBuildConfig.preset("tiny"), out, progress=False)
    return load_generator(out)


@pytest.mark.slow  # 272 / 583 tokens, three couplings, the untrained generator accepts few drafts: 5-8 s
@pytest.mark.parametrize("video", [False, True])
def test_greedy_scd_equals_the_generators_own_sampler(bundle, video):
    lm = ReferenceGenerator(bundle, video=video)
    layout = lm.layout()
    want = sample_codes(bundle, PROMPTS, 1, video, {"temperature": 0.0, "cfg_scale": 3.0}).codes_BN
    cond, uncond = lm.prompts(PROMPTS, cfg=True)
    for coupling in ("none", "mc", "gs"):
        cfg = ScdConfig(window=16, coupling=coupling, temperature=0.0, cfg_scale=3.0)
        res = JacobiDecoder(lm, layout, cfg).run(cond, uncond)
        assert torch.equal(lm.codes(res.tokens_BN), want), coupling
        assert bool((res.nfe_B <= layout.length).all())


def test_bodies_decode_to_images_and_videos(bundle):
    img = ReferenceGenerator(bundle)
    res = JacobiDecoder(img, img.layout(), ScdConfig(window=8, coupling="gs", cfg_scale=3.0)).run(
        *img.prompts(PROMPTS[:1], cfg=True))
    assert img.decode(res.tokens_BN)[0].size == (32, 32)
    vid = ReferenceGenerator(bundle, video=True)
    assert vid.layout().shape == (8, 8, 8)
    res = JacobiDecoder(vid, vid.layout(), ScdConfig(window=8, coupling="mc")).run(vid.prompts(PROMPTS[1:], False)[0])
    frames = vid.decode(res.tokens_BN)[0]
    assert len(frames) == 8 and frames[0].size == (16, 16)


def test_prompt_checks(bundle):
    lm = ReferenceGenerator(bundle)
    assert lm.check_prompt(PROMPTS[0]) is None
    assert lm.check_prompt("  ") == "empty prompt"
    assert "unknown words ['qwxz']" in lm.check_prompt("a qwxz on a gray background")
    assert "exceeds the limit" in lm.check_prompt(" ".join(["red"] * (lm.max_prompt_words() + 1)))


def test_adapter_for_a_reference_lm_is_the_plain_causal_adapter(bundle):
    assert type(adapter_for(bundle.image_lm)).__name__ == "CausalLMAdapter"
