"""Medusa's draft tree, batched: depth d's candidates are head d's top-`width` tokens, the same
under every parent (the heads see only the root state). A beam of the `width` best paths by summed
head log-probability is expanded per depth, and the `budget` best candidates form the tree (as
`draft.draft_tree` does for a feature drafter).

Shapes: B batch, K heads, W width, V vocabulary.
"""

from __future__ import annotations

import torch

from spec_core.decoding.draft import _MAX_LOGP
from spec_core.decoding.tree import DraftTree, TreeConfig, select_tree
from spec_core.medusa.heads import MedusaHeads


@torch.no_grad()
def medusa_tree(heads: MedusaHeads, root_h_BD: torch.Tensor, cfg: TreeConfig) -> DraftTree:
    """Tree from the target state that produced the root token (its LM-head input)."""
    logp_BKV = torch.log_softmax(heads(root_h_BD).double(), dim=-1).clamp_max(_MAX_LOGP)
    B, K, V = logp_BKV.shape
    W, depth = min(cfg.width, V), min(cfg.depth, K)
    top_lp_BKW, top_tok_BKW = logp_BKV.topk(W, dim=-1)
    dev = root_h_BD.device
    tokens, scores = [top_tok_BKW[:, 0]], [top_lp_BKW[:, 0]]
    parents = [torch.full((B, W), -1, dtype=torch.long, device=dev)]
    depths = [torch.ones(B, W, dtype=torch.long, device=dev)]
    front_idx, front_score, n_cand = torch.arange(W, device=dev).expand(B, W), top_lp_BKW[:, 0], W
    for d in range(1, depth):
        child_score = (front_score[:, :, None] + top_lp_BKW[:, d, None, :]).reshape(B, W * W)
        tokens.append(top_tok_BKW[:, d, None, :].expand(B, W, W).reshape(B, W * W))
        scores.append(child_score)
        parents.append(front_idx[:, :, None].expand(B, W, W).reshape(B, W * W))
        depths.append(torch.full((B, W * W), d + 1, dtype=torch.long, device=dev))
        front_score, pick = child_score.topk(W, dim=-1)
        front_idx, n_cand = n_cand + pick, n_cand + W * W
    return select_tree(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1),
                       torch.cat(depths, 1), cfg.budget)
