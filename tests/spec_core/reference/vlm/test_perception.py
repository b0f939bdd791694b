"""Stage-1 perception heads seed LLaVA's projector exactly (oracle: the heads' own logits)."""

import torch
import torch.nn.functional as F
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

from spec_core.reference.vlm.perception import PATCH_HEADS, PROJECTOR_HEADS, PerceptionHeads, init_projector


def _config(vision: int, text: int) -> LlavaConfig:
    return LlavaConfig(vision_config=CLIPVisionConfig(hidden_size=vision, num_attention_heads=2),
                       text_config=LlamaConfig(hidden_size=text, num_attention_heads=2, num_key_value_heads=2), projector_hidden_act="gelu")


def test_projector_rows_are_the_head_logits_and_word_directions():
    torch.manual_seed(0)
    heads = PerceptionHeads(32)
    proj = LlavaMultiModalProjector(_config(32, 192))
    n = init_projector(proj, heads, out_std=1.0)
    assert n == sum(PATCH_HEADS[k] for k in PROJECTOR_HEADS) == 73
    feats_BPD = torch.randn(2, 5, 32)
    hidden_BPH = proj.linear_1(feats_BPD)
    logits = torch.cat([heads.patch[k](feats_BPD) for k in PROJECTOR_HEADS], -1)
    assert torch.allclose(hidden_BPH[..., :n], logits, atol=1e-5)
    # the remaining rows come in +/- pairs spanning the word head's row space
    k = min((192 - n) // 2, 32)  # no more directions than the word head's rank
    plus, minus = hidden_BPH[..., n: n + k], hidden_BPH[..., n + k: n + 2 * k]
    assert torch.allclose(plus, -minus, atol=1e-5) and not torch.allclose(plus, torch.zeros_like(plus))
    assert torch.count_nonzero(proj.linear_1.weight[n + 2 * k:]) == 0
    # the word logits are recoverable from the kept directions (32-dim features: all of them)
    basis = proj.linear_1.weight[n: n + k]
    recon = torch.linalg.lstsq(basis.T, heads.patch["word"].weight.T).solution.T @ basis
    assert torch.allclose(recon, heads.patch["word"].weight, atol=1e-4)
    assert abs(proj.linear_2.weight.std().item() - 1.0) < 0.05


def test_narrow_projector_takes_the_rows_that_fit():
    heads = PerceptionHeads(16)
    proj = LlavaMultiModalProjector(_config(16, 64))
    assert init_projector(proj, heads) == 64
    x = torch.randn(3, 16)
    assert torch.allclose(proj.linear_1(x), torch.cat([heads.patch[k](x) for k in PROJECTOR_HEADS], -1)[:, :64],
                          atol=1e-5)
    assert F.gelu(proj.linear_1(x)).shape == (3, 64)
