"""retrieval_by_depth against the unroll and the retrieval rule: the same k, weights that are the
dense softmax restricted to the entries read, and the readout the correction uses."""

from __future__ import annotations

import torch

from spec_core.fovea.retrieval_stats import retrieval_by_depth
from spec_core.fovea.unroll import unroll
from tests.spec_core.fovea.conftest import drafter_for, synthetic_batch


def test_each_corrected_depth_reads_what_the_unroll_reads(llava_adapter):
    d = drafter_for(llava_adapter, correction_depth=1).eval()
    batch = synthetic_batch(32, lengths=(14, 10, 12), n_visual=(6, 3, 5))
    got = retrieval_by_depth(d, batch)
    steps = unroll(d, batch, 2)
    assert [r.depth for r in got] == [0, 1]
    mem = d.memory(batch.visual_BPD, batch.visual_valid_BP)
    for r, s in zip(got, steps):
        assert torch.equal(r.k_N, s.k_N)
        # each state scores a token inside the answer
        assert batch.loss_mask_BT[r.row_N, r.pos_N + r.depth + 2].all()
        read = r.weights_NP > 0
        assert torch.equal(read.sum(-1), r.k_N)
        torch.testing.assert_close(r.weights_NP.sum(-1), torch.ones(len(r.k_N)))
        torch.testing.assert_close(r.weights_NP, r.dense_NP * read / r.mass_N[:, None])
        # the entries read are the k with the most dense mass
        top = r.dense_NP.sort(-1, descending=True).values
        kth = top.gather(1, (r.k_N - 1)[:, None])[:, 0]
        assert (r.dense_NP[read] >= kth.repeat_interleave(r.k_N) - 1e-7).all()
        # the readout the correction adds is these weights over the memory's values
        with torch.no_grad():
            for n in (0, len(r.k_N) - 1):
                b = int(r.row_N[n])
                ro, _ = d.correction.readout(s.raw_ND[n][None, None], torch.tensor([[r.depth]]), mem.index([b]))
                torch.testing.assert_close(ro[0, 0], r.weights_NP[n] @ mem.values_BPD[b], atol=1e-5, rtol=1e-5)


def test_a_drafter_without_correction_reads_nothing(llava_adapter):
    d = drafter_for(llava_adapter, visual_correction=False)
    assert retrieval_by_depth(d, synthetic_batch(32)) == []
