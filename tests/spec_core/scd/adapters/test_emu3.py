"""Emu3Adapter against HF's Emu3 forward and its documented constrained image generation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Emu3ImageProcessor

from spec_core.scd.adapters import Emu3Adapter, adapter_for
from tests.spec_core.scd.adapters.ragged_loop import greedy_image, prefill, step
from tests.spec_core.scd.adapters.tiny_models import E_CODES, build_emu3, emu3_vocabulary

torch.set_num_threads(1)
VOCAB = emu3_vocabulary()
TEXT = [VOCAB[c] for c in "abcdeab"]
H, W = 2, 3  # visual tokens; W >= 3 keeps the docs' offset rule below unambiguous


@pytest.fixture(scope="module")
def model():
    return build_emu3()


@pytest.fixture(scope="module")
def lm(model):
    return Emu3Adapter(model)


def test_layout_and_prompts(lm):
    layout = lm.layout(H, W)
    eol, eof, eoi, eos = (VOCAB[n] for n in ("<|extra_200|>", "<|extra_201|>", "<|image end|>", "<|extra_204|>"))
    assert layout.forced_N.tolist() == [-1, -1, -1, eol, -1, -1, -1, eol, eof, eoi, eos]
    assert layout.shape == (H, W)
    visual = {VOCAB[f"<|visual token{i:06d}|>"] for i in range(E_CODES)}
    assert set(layout.allowed_V.nonzero().squeeze(-1).tolist()) == visual
    header = [VOCAB["<|image start|>"], VOCAB["2"], VOCAB["*"], VOCAB["3"], VOCAB["<|image token|>"]]
    bos = VOCAB["<|extra_203|>"]
    neg = [VOCAB["e"], VOCAB["d"]]
    assert lm.prompts(TEXT, H, W, neg) == ([bos] + TEXT + header, [bos] + neg + header)
    assert lm.prompts([bos] + TEXT, H, W)[0] == [bos] + TEXT + header
    assert lm.header_ids(12, 30)[1:-1] == [VOCAB[c] for c in "12*30"]


@torch.no_grad()
def test_prefill_logits_match_hf(model, lm):
    """Emu3's HF forward masks no logits: the adapter's logits are the HF logits, image tokens
    included, for two right-padded rows of different lengths."""
    rows = list(lm.prompts(TEXT, H, W, [VOCAB["e"]]))
    _, logits_GTV, _ = prefill(lm, rows, capacity=24)
    assert logits_GTV.shape[-1] == len(VOCAB)
    for g, row in enumerate(rows):
        want = model(input_ids=torch.tensor([row])).logits[0].float()
        torch.testing.assert_close(logits_GTV[g, :len(row)], want, atol=1e-4, rtol=0)


@torch.no_grad()
def test_cached_continuation_matches_full_forward(model, lm):
    rows = list(lm.prompts(TEXT, H, W, [VOCAB["e"]]))
    cache, _, len_G = prefill(lm, rows, capacity=24)
    visual = lambda i: VOCAB[f"<|visual token{i:06d}|>"]  # noqa: E731
    new_G3 = torch.tensor([[visual(5), visual(31), VOCAB["<|extra_200|>"]], [visual(0), visual(17), VOCAB["a"]]])
    for i in range(3):
        logits_GV = step(lm, cache, len_G + i, new_G3[:, i])
        for g, row in enumerate(rows):
            want = model(input_ids=torch.tensor([row + new_G3[g, :i + 1].tolist()])).logits[0, -1].float()
            torch.testing.assert_close(logits_GV[g], want, atol=1e-4, rtol=0)


def docs_prefix_allowed_tokens_fn(height: int, width: int, model):
    """The constraint of HF's Emu3 docs example (image generation), with this vocabulary's ids."""
    visual = model.vocabulary_mapping.image_tokens
    wrapper, eol, eof = VOCAB["<|image token|>"], VOCAB["<|extra_200|>"], VOCAB["<|extra_201|>"]
    eoi, eos, pad = VOCAB["<|image end|>"], VOCAB["<|extra_204|>"], VOCAB["<|endoftext|>"]

    def fn(batch_id, input_ids):
        position = torch.nonzero(input_ids == wrapper, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (width + 1) == 0:
            return (eol,)
        if offset == (width + 1) * height + 1:
            return (eof,)
        if offset == (width + 1) * height + 2:
            return (eoi,)
        if offset == (width + 1) * height + 3:
            return (eos,)
        if offset > (width + 1) * height + 3:
            return (pad,)
        return visual

    return fn


@torch.no_grad()
def test_greedy_loop_matches_hf_generate(model, lm):
    cond, _ = lm.prompts(TEXT, H, W)
    layout = lm.layout(H, W)
    ids = torch.tensor([cond])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=layout.length,
                         prefix_allowed_tokens_fn=docs_prefix_allowed_tokens_fn(H, W, model),
                         pad_token_id=VOCAB["<|endoftext|>"])
    want = out[0, len(cond):].tolist()
    ours = greedy_image(lm, layout, cond)
    assert ours == want
    assert len(set(ours) - set(layout.forced_N.tolist())) > 1  # not one visual token throughout


def test_decode_images(model, lm):
    gen = torch.Generator().manual_seed(0)
    visual_BN = lm.visual_token_ids[torch.randint(0, E_CODES, (2, H * W), generator=gen)]
    forced_N = lm.layout(H, W).forced_N
    body_BN = forced_N.expand(2, -1).clone()
    body_BN[:, forced_N < 0] = visual_BN
    images = lm.decode(body_BN, H, W)
    scale = 2 ** (len(model.config.vq_config.channel_multiplier) - 1)
    assert len(images) == 2 and all(im.size == (W * scale, H * scale) and im.mode == "RGB" for im in images)
    # the docs' path: decode_image_tokens on the generated body, then postprocess (mean = std = 0.5)
    processor = Emu3ImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    pixels = model.decode_image_tokens(image_tokens=body_BN, height=H, width=W)
    hf = processor.postprocess(list(pixels.float()), return_tensors="PIL.Image.Image")["pixel_values"]
    for ours, visual_only, theirs in zip(images, lm.decode(visual_BN, H, W), hf):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
        np.testing.assert_array_equal(np.asarray(visual_only), np.asarray(theirs))
    with pytest.raises(ValueError, match="body tokens"):
        lm.decode(body_BN[:, 1:], H, W)


def test_adapter_for_picks_emu3(model):
    assert type(adapter_for(model)) is Emu3Adapter
