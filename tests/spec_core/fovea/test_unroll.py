"""The training-time unroll equals drafting step by step through a KV cache, as at inference."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from spec_core.fovea.unroll import image_ranks, unroll
from tests.spec_core.fovea.conftest import drafter_for, synthetic_batch


@pytest.mark.parametrize("context", ["fused", "prefix", "compressed"])
def test_unrolled_states_equal_an_incremental_draft_chain(llava_adapter, context):
    d = drafter_for(llava_adapter, visual_correction=False, visual_context=context).eval()
    batch = synthetic_batch(32, lengths=(12,), answer=5, n_visual=(4,))
    batch.input_ids_BT[0, 2:6] = d.image_token_id  # an image: its inputs are the visual tokens
    T, depth = 12, 3
    steps = unroll(d, batch, depth)
    ids, feat = batch.input_ids_BT[0], batch.final_BTD[0]
    ranks = image_ranks(batch.input_ids_BT, d.image_token_id)[0]
    keep = d.context_keep(ids[1:][None], ranks[1:][None])  # compressed: image slots past 2 masked
    keep = torch.ones(1, T - 1, dtype=torch.bool) if keep is None else keep
    assert keep.sum() == T - 1 - (2 if context == "compressed" else 0)
    for s in steps:
        k = s.step
        sup = [t for t in range(T - k - 1) if batch.loss_mask_BT[0, t + k + 1]]
        assert len(s.draft_ND) == len(sup)
        for row, t in enumerate(sup):
            # the prefix 0..t with target features (the drafter's cache at inference) ...
            cache = DynamicCache()
            x = d.input_states(ids[1: t + 2][None], feat[: t + 1][None], batch.visual_BPD, ranks[1: t + 2][None])
            causal = torch.ones(t + 1, t + 1, dtype=torch.bool).tril()[None] & keep[:, None, : t + 1]
            h, _ = d.blocks(x, torch.arange(t + 1)[None], causal, cache)
            h = h[:, -1:]
            # ... then the draft chain, one node per call, feeding back its own state
            for j in range(2, k + 1):
                x = d.input_states(ids[t + j: t + j + 1][None], h, batch.visual_BPD, ranks[t + j: t + j + 1][None])
                attend = torch.cat([keep[:, : t + 1], torch.ones(1, j - 1, dtype=torch.bool)], 1)[:, None]
                h, _ = d.blocks(x, torch.tensor([[t + j - 1]]), attend, cache)
            torch.testing.assert_close(s.draft_ND[row], h[0, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(s.target_ND[row], feat[t + k])


def test_padding_does_not_change_a_samples_states(llava_adapter):
    d = drafter_for(llava_adapter).eval()
    alone = synthetic_batch(32, lengths=(10,), n_visual=(3,), seed=4)
    padded = synthetic_batch(32, lengths=(10, 15), n_visual=(3, 6), seed=4)  # same first sample
    for a, b in zip(unroll(d, alone, 2), unroll(d, padded, 2)):
        n = len(a.draft_ND)
        torch.testing.assert_close(a.draft_ND, b.draft_ND[:n], atol=1e-5, rtol=1e-5)


def test_correction_reads_memory_only_at_shallow_depths(llava_adapter):
    d = drafter_for(llava_adapter, correction_depth=1)
    steps = unroll(d, synthetic_batch(32), 3)
    assert [bool((s.k_N > 0).all()) for s in steps] == [True, True, False]
    assert int(steps[0].k_N.max()) <= 4  # k_max


@pytest.mark.parametrize("feedback", ["uncorrected", "corrected"])
def test_corrected_depths_feed_back_the_state_the_config_names(llava_adapter, feedback):
    """With correction at depths <= 1, step j's scored state is correct(h_j, j - 1); the next step
    reads h_j or that corrected state, as `feedback` says - checked against a step-by-step chain."""
    d = drafter_for(llava_adapter, correction_depth=1, feedback=feedback).eval()
    batch = synthetic_batch(32, lengths=(12,), answer=5, n_visual=(4,))
    T, depth = 12, 3
    steps = unroll(d, batch, depth)
    ids, feat = batch.input_ids_BT[0], batch.final_BTD[0]
    mem = d.memory(batch.visual_BPD, batch.visual_valid_BP)

    def scored(h, level):
        return d.correct(h, torch.full(h.shape[:2], level, dtype=torch.long), mem).hidden_BSD

    for s in steps:
        k = s.step
        sup = [t for t in range(T - k - 1) if batch.loss_mask_BT[0, t + k + 1]]
        for row, t in enumerate(sup):
            cache = DynamicCache()
            x = d.input_states(ids[1: t + 2][None], feat[: t + 1][None])
            h, _ = d.blocks(x, torch.arange(t + 1)[None], torch.ones(t + 1, t + 1, dtype=torch.bool).tril()[None], cache)
            h = h[:, -1:]
            for j in range(2, k + 1):
                fed = scored(h, j - 2) if feedback == "corrected" else h
                x = d.input_states(ids[t + j: t + j + 1][None], fed)
                h, _ = d.blocks(x, torch.tensor([[t + j - 1]]), torch.ones(1, 1, j - 1 + t + 1, dtype=torch.bool), cache)
            torch.testing.assert_close(s.raw_ND[row], h[0, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(s.draft_ND[row], scored(h, k - 1)[0, 0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(steps[0].draft_ND, steps[0].raw_ND)  # depth 0 is corrected
    torch.testing.assert_close(steps[2].draft_ND, steps[2].raw_ND)  # depth 2 is not
