"""The drafter copies the target's layer type, trains only its own weights, and round-trips."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLDecoderLayer

from spec_core.fovea import FoveaDrafter, drafter_loss
from spec_core.fovea.unroll import image_ranks
from tests.spec_core.fovea.conftest import drafter_for, synthetic_batch


def test_blocks_are_the_targets_own_layer_class(llava_adapter, qwen_adapter):
    d = drafter_for(llava_adapter, n_blocks=2)
    assert len(d.layers) == 2 and all(type(x) is LlamaDecoderLayer for x in d.layers)
    q = drafter_for(qwen_adapter, n_blocks=1)
    assert type(q.layers[0]) is Qwen2_5_VLDecoderLayer
    attn = q.layers[0].self_attn  # grouped-query layout of the target (4 query heads, 2 kv heads)
    assert attn.k_proj.out_features * 2 == attn.q_proj.out_features
    out = drafter_loss(q, synthetic_batch(32))  # M-RoPE layers run on 1-D drafter positions
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("switch", [{}, {"visual_correction": False}, {"gate": False},
                                    {"depth_embedding": False}, {"retrieval": "dense"},
                                    {"retrieval": "fixed", "k_fixed": 2}])
def test_only_drafter_weights_get_gradients(llava_adapter, switch):
    d = drafter_for(llava_adapter, **switch)
    drafter_loss(d, synthetic_batch(32)).loss.backward()
    assert d.embed_tokens.weight.grad is None and d.lm_head.weight.grad is None
    no_grad = [n for n, p in d.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == []
    target_params = list(llava_adapter.model.parameters())
    assert all(p.grad is None and not p.requires_grad for p in target_params)


def test_ablation_switches_remove_their_modules(llava_adapter):
    assert drafter_for(llava_adapter, visual_correction=False).correction is None
    assert drafter_for(llava_adapter, gate=False).correction.g is None
    assert drafter_for(llava_adapter, depth_embedding=False).correction.depth is None


def test_save_load_round_trip_is_exact(llava_adapter, tmp_path):
    d = drafter_for(llava_adapter, seed=3)
    with torch.no_grad():
        for p in d.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.1)  # not the init: a real round trip
    d.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["target"]["hidden_size"] == 32 and meta["fovea"]["k_max"] == 4
    back = FoveaDrafter.from_pretrained(tmp_path)
    for (n, a), (_, b) in zip(d.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n
    batch = synthetic_batch(32)
    assert torch.equal(drafter_loss(d, batch).loss, drafter_loss(back, batch).loss)


def test_loading_onto_another_target_is_refused(llava_adapter, qwen_adapter, tmp_path):
    drafter_for(llava_adapter).save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["target"]["vocab_size"] = 7
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="trained for a target"):
        FoveaDrafter.from_pretrained(tmp_path, llava_adapter)
    with pytest.raises(ValueError, match="trained for a target"):
        FoveaDrafter.from_pretrained(tmp_path, llava_adapter.model)  # the HF model works too
    (tmp_path / "config.json").write_text('{"format": "pickle"}')
    with pytest.raises(ValueError, match="not a FOVEA drafter"):
        FoveaDrafter.from_pretrained(tmp_path, llava_adapter)


def test_from_an_hf_model_with_config_keywords_and_a_qwen_round_trip(qwen_adapter, tmp_path):
    d = FoveaDrafter.from_target(qwen_adapter.model, n_blocks=1, k_min=2, k_max=4)
    assert d.cfg.n_blocks == 1 and d.cfg.k_max == 4 and d.cfg.rho == 0.8
    assert torch.equal(d.lm_head.weight, qwen_adapter.lm_head.weight)
    d.save_pretrained(tmp_path)
    back = FoveaDrafter.from_pretrained(tmp_path, qwen_adapter)
    assert type(back.layers[0]) is Qwen2_5_VLDecoderLayer
    batch = synthetic_batch(32)
    assert torch.equal(drafter_loss(d, batch).loss, drafter_loss(back, batch).loss)


def test_image_placeholders_are_embedded_as_their_visual_tokens(llava_adapter):
    d = drafter_for(llava_adapter)
    img = d.image_token_id
    assert img == llava_adapter.image_token_id
    ids = torch.tensor([[5, img, img, 7, img]])
    visual = torch.randn(1, 3, 32)
    ranks = image_ranks(ids, img)
    assert ranks.tolist() == [[-1, 0, 1, -1, 2]]
    feat = torch.zeros(1, 5, 32)
    got = d.input_states(ids, feat, visual, ranks)
    expect = d.fc(torch.cat([torch.stack([d.embed_tokens.weight[5], visual[0, 0], visual[0, 1],
                                          d.embed_tokens.weight[7], visual[0, 2]])[None], feat], -1))
    torch.testing.assert_close(got, expect)
    plain = d.fc(torch.cat([d.embed_tokens(ids), feat], -1))
    torch.testing.assert_close(d.input_states(ids, feat), plain)  # no visual: the embedding rows


def test_cached_blocks_equal_one_full_causal_pass(llava_adapter):
    """Prefix in one call then one token per call through the cache == one causal pass."""
    d = drafter_for(llava_adapter).eval()
    T = 9
    x = torch.randn(1, T, 32)
    pos = torch.arange(T)[None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    full, _ = d.blocks(x, pos, causal)
    cache = DynamicCache()
    part, _ = d.blocks(x[:, :5], pos[:, :5], causal[:, :5, :5], cache)
    outs = [part]
    for t in range(5, T):
        h, _ = d.blocks(x[:, t:t + 1], pos[:, t:t + 1], torch.ones(1, 1, t + 1, dtype=torch.bool), cache)
        outs.append(h)
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


def test_prefix_context_reads_raw_visual_tokens_and_compressed_reads_query_summaries(llava_adapter):
    img = llava_adapter.image_token_id
    ids = torch.tensor([[5, img, img, img, 7]])
    ranks = image_ranks(ids, img)
    visual, feat = torch.randn(1, 3, 32), torch.randn(1, 5, 32)
    fused = drafter_for(llava_adapter).input_states(ids, feat, visual, ranks)
    d = drafter_for(llava_adapter, visual_context="prefix")
    got = d.input_states(ids, feat, visual, ranks)
    torch.testing.assert_close(got[0, 1:4], d.visual_in(visual[0]))      # no target feature in image slots
    text = d.fc(torch.cat([d.embed_tokens(ids), feat], -1))
    torch.testing.assert_close(got[0, [0, 4]], text[0, [0, 4]])           # text slots as always
    assert not torch.allclose(got, fused)
    assert d.context_keep(ids, ranks) is None

    c = drafter_for(llava_adapter, visual_context="compressed", num_queries=2)
    got = c.input_states(ids, feat, visual, ranks)
    summary = c.compressor(visual)
    torch.testing.assert_close(got[0, 1:3], summary[0])                   # slot r < Q: summary r
    assert c.context_keep(ids, ranks).tolist() == [[True, True, True, False, True]]
    # the summaries read every valid visual token and none of the padding
    padded = torch.cat([visual, torch.randn(1, 2, 32)], 1)
    torch.testing.assert_close(c.compressor(padded, torch.tensor([[True] * 3 + [False] * 2])), summary)
    assert not torch.allclose(c.compressor(visual * 2), summary)
    with pytest.raises(ValueError, match="visual_context"):
        drafter_for(llava_adapter, visual_context="insert")
