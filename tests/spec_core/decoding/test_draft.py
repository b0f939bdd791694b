"""A draft tree of width 1 against drafting the same chain by hand, one node per call."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from spec_core.decoding.cache import RaggedCache
from spec_core.decoding.draft import draft_tree
from spec_core.decoding.tree import TreeConfig
from tests.spec_core.fovea.conftest import drafter_for, llava_adapter  # noqa: F401 (fixture)


@pytest.mark.parametrize("feedback", ["uncorrected", "corrected"])
def test_a_width_one_tree_is_the_greedy_draft_chain(llava_adapter, feedback):  # noqa: F811
    d = drafter_for(llava_adapter, correction_depth=1, feedback=feedback).eval()
    g = torch.Generator().manual_seed(3)
    T, D = 9, d.fc.weight.shape[0]
    ids_T, feat_TD = torch.randint(3, 90, (T,), generator=g), torch.randn(T, D, generator=g)
    mem = d.memory(torch.randn(1, 5, D, generator=g), torch.ones(1, 5, dtype=torch.bool))
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        cache = RaggedCache(1, 64, len(d.layers))
        cache.plan(torch.arange(T)[None])
        h_root, _ = d.blocks(d.input_states(ids_T[None], feat_TD[None]), torch.arange(T)[None], causal, cache)
        tree = draft_tree(d, cache, h_root[:, -1], torch.tensor([T]), mem, TreeConfig(width=1, depth=3, budget=3))

        ref = DynamicCache()
        h, _ = d.blocks(d.input_states(ids_T[None], feat_TD[None]), torch.arange(T)[None], causal, ref)
        h, tokens, score, scores = h[:, -1:], [], 0.0, []
        for depth in range(3):
            h_hat = d.correct(h, torch.full((1, 1), depth), mem).hidden_BSD
            logp = torch.log_softmax(d.logits(h_hat).double(), -1)[0, 0]
            tok = int(logp.argmax())
            score += float(logp[tok])
            tokens.append(tok)
            scores.append(score)
            fed = h_hat if feedback == "corrected" else h
            x = d.input_states(torch.tensor([[tok]]), fed)
            h, _ = d.blocks(x, torch.tensor([[T + depth]]), torch.ones(1, 1, T + depth + 1, dtype=torch.bool), ref)
    assert tree.tokens_BN[0].tolist() == tokens
    assert tree.depth_BN[0].tolist() == [1, 2, 3]
    torch.testing.assert_close(tree.score_BN[0], torch.tensor(scores, dtype=tree.score_BN.dtype), atol=1e-4, rtol=1e-4)
