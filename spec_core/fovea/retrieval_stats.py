"""What FOVEA's retrieval reads, on teacher-forced data (the training unroll's states): per
corrected draft depth, the entries each state reads (k), the mass those entries hold in the
softmax over every valid entry (Eq. 6's mass reached, before Eq. 7 renormalises), the readout
weights themselves and the dense softmax beside them - so that a caller can ask where the
weight falls (e.g. on the panel a region question names: scripts/retrieval_stats.py).

Shapes: N states of one draft depth, P memory entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_core.fovea.data import DraftBatch
from spec_core.fovea.drafter import FoveaDrafter
from spec_core.fovea.retrieval import dense_weights
from spec_core.fovea.unroll import unroll


@dataclass
class DepthRetrieval:
    depth: int                 # tree depth (draft step - 1)
    row_N: torch.Tensor        # which sample of the batch
    pos_N: torch.Tensor        # the state's position t; it scores the token at t + depth + 2
    k_N: torch.Tensor          # entries read
    mass_N: torch.Tensor       # dense-softmax mass of the entries read
    weights_NP: torch.Tensor   # readout weights (sum to 1 over the entries read)
    dense_NP: torch.Tensor     # softmax over every valid entry


@torch.no_grad()
def retrieval_by_depth(drafter: FoveaDrafter, batch: DraftBatch, depth: int | None = None) -> list[DepthRetrieval]:
    """One entry per corrected depth among the first `depth` draft steps (default: every
    corrected depth); empty for a drafter without visual correction."""
    corr = drafter.correction
    if corr is None:
        return []
    depth = corr.cfg.correction_depth + 1 if depth is None else depth
    mem = drafter.memory(batch.visual_BPD, batch.visual_valid_BP)
    out = []
    for s in unroll(drafter, batch, depth):
        level = s.step - 1
        if level > corr.cfg.correction_depth or not len(s.row_N):
            continue
        parts = []
        for b in s.row_N.unique().tolist():  # one sample's memory at a time
            sel = (s.row_N == b).nonzero()[:, 0]
            h_1SD = s.raw_ND[sel][None]
            scores, weights, k = corr.attend(h_1SD, torch.full(h_1SD.shape[:2], level), mem.index([b]))
            dense, _ = dense_weights(scores, mem.valid_BP[b].expand_as(scores))
            parts.append((sel, k[0], weights[0], dense[0]))
        sel = torch.cat([p[0] for p in parts])
        order = torch.argsort(sel)
        k_N, weights_NP, dense_NP = (torch.cat([p[i] for p in parts])[order] for i in (1, 2, 3))
        out.append(DepthRetrieval(level, s.row_N, s.pos_N, k_N, (dense_NP * (weights_NP > 0)).sum(-1),
                                  weights_NP, dense_NP))
    return out
