"""JanusAdapter against HF's own Janus image-generation path on a tiny random model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import JanusImageProcessorPil, LogitsProcessor, LogitsProcessorList

from spec_core.scd.adapters import JanusAdapter, adapter_for
from tests.spec_core.scd.adapters.ragged_loop import greedy_image, prefill, step
from tests.spec_core.scd.adapters.tiny_models import J_BOI, J_BOS, J_CODES, J_GRID, J_PAD, build_janus

torch.set_num_threads(1)
TEXT = [5, 9, 17, 33, 4, 21]


@pytest.fixture(scope="module")
def model():
    return build_janus()


@pytest.fixture(scope="module")
def lm(model):
    return JanusAdapter(model)


def hf_image_logits(model, ids_BT: torch.Tensor, codes_BS: torch.Tensor | None = None) -> torch.Tensor:
    """What HF's generate computes, without a cache: JanusModel on the prompt ids (then on text
    embeddings + prepare_embeddings_for_image_generation(codes)), then generation_head."""
    if codes_BS is None:
        hidden = model.model(input_ids=ids_BT).last_hidden_state
    else:
        embeds = torch.cat([model.get_input_embeddings()(ids_BT),
                            model.prepare_embeddings_for_image_generation(codes_BS)], 1)
        hidden = model.model(inputs_embeds=embeds).last_hidden_state
    return model.model.generation_head(hidden).float()


def test_prompts_follow_hf_generate(lm):
    cond, uncond = lm.prompts(TEXT)
    assert cond == [J_BOS] + TEXT + [J_BOI]
    assert uncond == [J_BOS] + [J_PAD] * len(TEXT) + [J_BOI]
    assert lm.prompts([J_BOS] + TEXT) == (cond, uncond)  # a leading BOS is not doubled


def test_layout(lm):
    layout = lm.layout()
    assert layout.length == J_GRID * J_GRID and bool((layout.forced_N == -1).all())
    assert layout.allowed_V is None and layout.shape == (J_GRID, J_GRID)


@torch.no_grad()
def test_prefill_logits_match_hf(model, lm):
    """Two right-padded rows of different lengths in one RaggedCache forward."""
    cond, _ = lm.prompts(TEXT)
    short = [J_BOS, 7, J_BOI]
    _, logits_GTV, _ = prefill(lm, [cond, short], capacity=16)
    assert logits_GTV.shape[-1] == J_CODES and logits_GTV.dtype == torch.float32
    for g, row in enumerate([cond, short]):
        want = hf_image_logits(model, torch.tensor([row]))[0]
        torch.testing.assert_close(logits_GTV[g, :len(row)], want, atol=1e-4, rtol=0)


@torch.no_grad()
def test_cached_continuation_matches_full_forward(model, lm):
    cond, uncond = lm.prompts(TEXT)
    cache, logits_GTV, len_G = prefill(lm, [cond, uncond], capacity=16)
    codes_G3 = torch.tensor([[3, 40, 11], [27, 0, 47]])
    for i in range(3):
        logits_GV = step(lm, cache, len_G + i, codes_G3[:, i])
        want = hf_image_logits(model, torch.tensor([cond, uncond]), codes_G3[:, :i + 1])[:, -1]
        torch.testing.assert_close(logits_GV, want, atol=1e-4, rtol=0)


class ConditionalRowsOnly(LogitsProcessor):
    """HF's image generate always doubles the batch (conditional, unconditional) and only a CFG
    processor (guidance_scale > 1) folds it back; with guidance_scale=1 it crashes writing 2B ids
    into B rows. Keeping the conditional half is CFG off inside HF's own loop."""

    def __call__(self, input_ids, scores):
        return scores[: scores.shape[0] // 2]


@torch.no_grad()
def test_greedy_loop_matches_hf_generate(model, lm):
    cond, _ = lm.prompts(TEXT)
    ids = torch.tensor([cond])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False,
                          guidance_scale=1, logits_processor=LogitsProcessorList([ConditionalRowsOnly()]))
    assert greedy_image(lm, lm.layout(), cond) == want[0].tolist()


@torch.no_grad()
def test_cfg_greedy_loop_matches_hf_generate(model, lm):
    """HF builds the unconditional row itself (pads all but BOS / BOI): equal tokens show that
    `prompts` builds the same row and that CFG on raw logits is what HF does."""
    cond, uncond = lm.prompts(TEXT)
    ids = torch.tensor([cond])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False,
                          guidance_scale=3.0)
    guided = greedy_image(lm, lm.layout(), cond, uncond, scale=3.0)
    assert guided == want[0].tolist()
    assert guided != greedy_image(lm, lm.layout(), cond)  # the unconditional row mattered


def test_decode_images(model, lm):
    codes_BN = torch.randint(0, J_CODES, (2, J_GRID * J_GRID), generator=torch.Generator().manual_seed(0))
    images = lm.decode(codes_BN)
    side = J_GRID * 2 ** (len(model.config.vq_config.channel_multiplier) - 1)
    assert len(images) == 2 and all(im.size == (side, side) and im.mode == "RGB" for im in images)
    # HF's documented path: decode_image_tokens, then the processor's postprocess (mean = std = 0.5
    # as in the released preprocessor config). The PIL backend (no torchvision here) normalises
    # channels-first only, so decode_image_tokens' channels-last output is permuted back first.
    processor = JanusImageProcessorPil(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    pixels_BCHW = model.decode_image_tokens(codes_BN).permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)
    hf = processor.postprocess(list(pixels_BCHW.float()), return_tensors="PIL.Image.Image")["pixel_values"]
    for ours, theirs in zip(images, hf):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    for ours, theirs in zip(lm.decode(codes_BN, image_processor=processor), hf):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    with pytest.raises(ValueError, match="codes per image"):
        lm.decode(codes_BN[:, :-1])


def test_adapter_for_picks_janus(model):
    assert type(adapter_for(model)) is JanusAdapter


def test_missing_boi_is_a_user_error():
    model = build_janus()
    model.generation_config.generation_kwargs = {}
    with pytest.raises(ValueError, match="boi_token_id"):
        JanusAdapter(model)
    assert JanusAdapter(model, boi_token_id=J_BOI).boi_token_id == J_BOI
    # a generation config derived from the model's config (`_from_model_config`): transformers
    # drops its generation_kwargs on load; the same user error, not an AttributeError
    del model.generation_config.generation_kwargs
    with pytest.raises(ValueError, match="boi_token_id"):
        JanusAdapter(model)
