"""ChameleonAdapter against HF's Chameleon forward / generate with its image-token mask undone.

HF's `ChameleonForConditionalGeneration.forward` writes the dtype's minimum into every image
token's logit (text generation only). The oracle here keeps HF's own code path and captures the
`lm_head` output before that in-place write with a forward hook that hands HF a copy.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from spec_core.scd.adapters import ChameleonAdapter, adapter_for
from tests.spec_core.scd.adapters.ragged_loop import greedy_image, prefill, step
from tests.spec_core.scd.adapters.tiny_models import C_CODES, build_chameleon, chameleon_vocabulary

torch.set_num_threads(1)
VOCAB = chameleon_vocabulary()
TEXT = [VOCAB[f"w{i}"] for i in (3, 7, 1, 12, 5)]
BOS, BOI = VOCAB["<s>"], VOCAB["<racm3:break>"]
N_TOKENS = 9


@pytest.fixture(scope="module")
def model():
    return build_chameleon()


@pytest.fixture(scope="module")
def lm(model):
    return ChameleonAdapter(model)


class RawLogits:
    """Context: a hook on lm_head keeps its output (HF then masks a copy, not ours)."""

    def __init__(self, model):
        self.model, self.last = model, None

    def _hook(self, module, args, output):
        self.last = output.detach().clone()
        return output.clone()

    def __enter__(self):
        self.handle = self.model.lm_head.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def hf_logits(model, ids_BT: torch.Tensor) -> torch.Tensor:
    """HF's forward; checks the mask it applies, returns the logits before it."""
    image = torch.tensor(model.model.vocabulary_mapping.image_tokens)
    with RawLogits(model) as raw:
        masked = model(input_ids=ids_BT).logits
    assert bool((masked[..., image] == torch.finfo(masked.dtype).min).all())
    text = torch.ones(masked.shape[-1], dtype=torch.bool)
    text[image] = False
    torch.testing.assert_close(masked[..., text], raw.last[..., text], atol=0, rtol=0)
    return raw.last.float()


def test_layout_and_prompts(lm):
    layout = lm.layout(N_TOKENS)
    assert layout.length == N_TOKENS and bool((layout.forced_N == -1).all()) and layout.shape == (N_TOKENS,)
    image = {i for name, i in VOCAB.items() if name.startswith("IMGIMG")}
    assert set(layout.allowed_V.nonzero().squeeze(-1).tolist()) == image and len(image) == C_CODES
    assert lm.prompts(TEXT) == ([BOS] + TEXT + [BOI], [BOS, BOI])
    assert lm.prompts([BOS] + TEXT) == lm.prompts(TEXT)


@torch.no_grad()
def test_prefill_logits_match_hf(model, lm):
    rows = list(lm.prompts(TEXT))
    _, logits_GTV, _ = prefill(lm, rows, capacity=16)
    for g, row in enumerate(rows):
        torch.testing.assert_close(logits_GTV[g, :len(row)], hf_logits(model, torch.tensor([row]))[0],
                                   atol=1e-4, rtol=0)


@torch.no_grad()
def test_cached_continuation_matches_full_forward(model, lm):
    rows = list(lm.prompts(TEXT))
    cache, _, len_G = prefill(lm, rows, capacity=16)
    image = model.model.vocabulary_mapping.image_tokens
    new_G3 = torch.tensor([[image[4], image[30], image[0]], [image[9], image[9], VOCAB["w2"]]])
    for i in range(3):
        logits_GV = step(lm, cache, len_G + i, new_G3[:, i])
        for g, row in enumerate(rows):
            want = hf_logits(model, torch.tensor([row + new_G3[g, :i + 1].tolist()]))[0, -1]
            torch.testing.assert_close(logits_GV[g], want, atol=1e-4, rtol=0)


class ImageTokensFromRaw(LogitsProcessor):
    """Replace HF's masked scores by the captured raw logits restricted to image tokens."""

    def __init__(self, raw: RawLogits, image: list[int]):
        self.raw, self.image = raw, image

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, float("-inf"))
        out[:, self.image] = self.raw.last[:, -1, self.image].to(scores.dtype)
        return out


@torch.no_grad()
def test_greedy_loop_matches_hf_generate(model, lm):
    cond, _ = lm.prompts(TEXT)
    ids = torch.tensor([cond])
    image = model.model.vocabulary_mapping.image_tokens
    with RawLogits(model) as raw:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=N_TOKENS,
                             min_new_tokens=N_TOKENS, pad_token_id=0,
                             logits_processor=LogitsProcessorList([ImageTokensFromRaw(raw, image)]))
    want = out[0, len(cond):].tolist()
    ours = greedy_image(lm, lm.layout(N_TOKENS), cond)
    assert ours == want and len(set(ours)) > 1


def test_decode_gives_codebook_indices(model, lm):
    mapping = model.model.vocabulary_mapping
    codes_BN = torch.randint(0, C_CODES, (2, N_TOKENS), generator=torch.Generator().manual_seed(0))
    tokens_BN = mapping.convert_img2bpe(codes_BN).long()  # HF's own code -> BPE map
    assert torch.equal(lm.decode(tokens_BN), codes_BN)
    assert lm.decode(tokens_BN, decoder=lambda c: c * 10).tolist() == (codes_BN * 10).tolist()
    with pytest.raises(ValueError, match="not image tokens"):
        lm.decode(torch.tensor([[BOI]]))


def test_adapter_for_picks_chameleon(model):
    assert type(adapter_for(model)) is ChameleonAdapter
