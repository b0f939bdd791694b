"""Attention entropy recomputed from an attention module's input equals the entropy of that
module's own eager attention probabilities (GQA, q/k norms, padding, query chunks); the layer
range is clamped below the last layer."""

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

from spec_core.targets.entropy import attention_entropy_BT, searched_layers


def test_range_is_clamped_below_the_last_layer():
    assert searched_layers((1, 10), 10) == (1, 9)   # the reference target: 1..9
    assert searched_layers((1, 10), 28) == (1, 10)
    assert searched_layers((2, 3), 4) == (2, 3)
    for bad in [(0, 3), (3, 2)]:
        with pytest.raises(ValueError, match="first <= last"):
            searched_layers(bad, 10)
    with pytest.raises(ValueError, match="no layer below the last"):
        searched_layers((4, 6), 4)


def _eager_entropy(attn, rotary, hidden_BTD, valid_BT):
    """Oracle: the module's own eager forward with HF's padded causal mask."""
    attn.config._attn_implementation = "eager"
    B, T, _ = hidden_BTD.shape
    allowed_BTT = torch.ones(T, T).tril().bool()[None] & valid_BT[:, None, :].bool()
    mask_B1TT = torch.zeros(B, 1, T, T).masked_fill(~allowed_BTT[:, None], torch.finfo(torch.float32).min)
    pos_BT = torch.arange(T)[None].expand(B, -1)
    _, probs_BNTT = attn(hidden_BTD, position_embeddings=rotary(hidden_BTD, pos_BT),
                         attention_mask=mask_B1TT)
    return torch.special.entr(probs_BNTT).sum(-1).mean(1)  # (B, N, T, T) -> (B, T)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_entropy_matches_the_modules_eager_attention(family):
    torch.manual_seed(0)
    kw = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    if family == "llama":
        config = LlamaConfig(**kw)
        attn, rotary = LlamaAttention(config, 0), LlamaRotaryEmbedding(config)
    else:  # per-head q/k norms
        config = Qwen3Config(**kw, head_dim=8)
        attn, rotary = Qwen3Attention(config, 0), Qwen3RotaryEmbedding(config)
        with torch.no_grad():
            attn.q_norm.weight.uniform_(0.5, 2.0)
            attn.k_norm.weight.uniform_(0.5, 2.0)
    hidden_BTD = torch.randn(2, 7, 32)
    valid_BT = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    cos, sin = rotary(hidden_BTD, torch.arange(7)[None].expand(2, -1))
    with torch.no_grad():
        expected_BT = _eager_entropy(attn, rotary, hidden_BTD, valid_BT)
        whole_BT = attention_entropy_BT(attn, hidden_BTD, cos, sin, valid_BT)
        chunked_BT = attention_entropy_BT(attn, hidden_BTD, cos, sin, valid_BT, query_chunk=3)
    real = valid_BT.bool()
    assert torch.allclose(whole_BT[real], expected_BT[real], atol=1e-5)
    assert torch.allclose(chunked_BT, whole_BT, atol=1e-6)
    # a sample's first real token sees only itself: entropy 0, like padding queries
    assert (whole_BT[~real] == 0).all() and (whole_BT[real][[1, 2, 3, 4, 6]] > 0).all()
