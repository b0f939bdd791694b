"""Medusa heads: start as the target's head, round-trip exactly, are trained against the target's
own greedy tokens k + 1 places ahead (checked against a loop oracle), and draft the beam tree."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from spec_core.decoding import load_drafter
from spec_core.decoding.tree import TreeConfig
from spec_core.fovea import FoveaDrafter
from spec_core.decoding.medusa_draft import medusa_tree
from spec_core.medusa import MedusaHeads, medusa_loss
from spec_core.targets import adapter_for
from tests.spec_core.fovea.conftest import synthetic_batch
from tests.spec_core.targets.conftest import build_llava


@pytest.fixture(scope="module")
def llava_adapter():
    return adapter_for(build_llava())


def test_untrained_heads_are_the_targets_head_and_only_heads_train(llava_adapter):
    heads = MedusaHeads.from_target(llava_adapter, num_heads=4)
    h = torch.randn(5, 32)
    logits = heads(h)
    assert logits.shape == (5, 4, llava_adapter.text_config.vocab_size)
    for k in range(4):
        torch.testing.assert_close(logits[:, k], llava_adapter.lm_head(h))
    assert all(not p.requires_grad for p in heads.lm_head.parameters())
    assert len(heads.trainable_parameters()) == 4 * 3  # per head: ResBlock weight + bias, head weight


def test_save_load_round_trip_and_dispatch(llava_adapter, tmp_path):
    torch.manual_seed(0)
    heads = MedusaHeads.from_target(llava_adapter)
    for p in heads.trainable_parameters():
        p.data.normal_()
    heads.save_pretrained(tmp_path / "m")
    back = load_drafter(tmp_path / "m", llava_adapter)
    assert isinstance(back, MedusaHeads)
    h = torch.randn(3, 32)
    assert torch.equal(heads(h), back(h))
    assert json.loads((tmp_path / "m" / "config.json").read_text())["format"] == "medusa-heads/1"
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    meta["target"]["vocab_size"] = 7
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="Medusa heads .* trained for a target"):
        MedusaHeads.from_pretrained(tmp_path / "m", llava_adapter)
    with pytest.raises(ValueError, match="not a FOVEA drafter"):
        FoveaDrafter.from_pretrained(tmp_path / "m")


def test_loss_matches_a_loop_over_states_and_heads(llava_adapter):
    torch.manual_seed(1)
    heads = MedusaHeads.from_target(llava_adapter, num_heads=3)
    for p in heads.trainable_parameters():
        p.data.normal_(std=0.1)
    batch = synthetic_batch(32, lengths=(14, 10), answer=5)
    out = medusa_loss(heads, batch)
    num, z = 0.0, 0.0
    for b in range(2):
        T = int(batch.attention_mask_BT[b].sum())
        for k in (1, 2, 3):
            for t in range(T - k - 1):
                if not batch.loss_mask_BT[b, t + k + 1]:
                    continue
                y = heads.lm_head(batch.final_BTD[b, t + k]).argmax()
                num += 0.8 ** (k - 1) * F.cross_entropy(heads(batch.final_BTD[b, t])[k - 1][None], y[None])
                z += 0.8 ** (k - 1)
    torch.testing.assert_close(out.loss, num / z)
    assert out.count.tolist() == [10.0, 10.0, 10.0]  # each head: every answer token, from k + 1 places before
    out.loss.backward()
    assert heads.heads[0].weight.grad is not None and heads.lm_head.weight.grad is None


def test_tree_is_the_beam_over_heads(llava_adapter):
    torch.manual_seed(2)
    heads = MedusaHeads.from_target(llava_adapter, num_heads=3)
    for p in heads.trainable_parameters():
        p.data.normal_(std=0.3)
    h = torch.randn(2, 32)
    tree = medusa_tree(heads, h, TreeConfig(width=3, depth=3, budget=10))
    logp = torch.log_softmax(heads(h).double(), -1)
    assert tree.tokens_BN.shape == (2, 10)
    for b in range(2):
        top = [logp[b, k].topk(3).indices.tolist() for k in range(3)]
        for i in range(10):
            d = int(tree.depth_BN[b, i])
            assert int(tree.tokens_BN[b, i]) in top[d - 1]  # depth d: one of head d's top-3
            parent = int(tree.parent_BN[b, i])
            assert (parent == 0) == (d == 1) and (parent == 0 or int(tree.depth_BN[b, parent - 1]) == d - 1)
        assert sorted(tree.tokens_BN[b, tree.depth_BN[b] == 1].tolist()) == sorted(top[0])
    # depth is capped by the number of heads
    assert int(medusa_tree(heads, h, TreeConfig(width=2, depth=6, budget=30)).depth_BN.max()) == 3
