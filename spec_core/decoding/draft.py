"""EAGLE-2-style dynamic draft trees from a FOVEA drafter, batched over samples.

The root state (the drafter's output at the last committed position, scored with correction at
depth 0) proposes `width` children. At each depth d = 1..D-1 the `width` best frontier nodes by
cumulative log-probability are run through the drafter in one forward - input [embed(token);
uncorrected parent state], position = root position + d - 1 (as in training, `fovea.unroll`),
attending to the committed drafter cache plus the node's own ancestors - and each proposes `width`
children, scored with the corrected state when d <= correction_depth. The `budget` best of all
candidates become the tree. Frontier KV entries are written past each row's committed length
(scratch) and never committed: after verification the drafter re-reads the accepted tokens with
the target's own features.

Shapes: B batch, W width, D hidden, V vocabulary, C candidates, K keys.
"""

from __future__ import annotations

import torch

from spec_core.decoding.cache import RaggedCache
from spec_core.decoding.tree import DraftTree, TreeConfig, prefix_and_new_mask, select_tree
from spec_core.fovea.correction import VisualMemory
from spec_core.fovea.drafter import FoveaDrafter

# Child log-probabilities are capped just below 0 so that scores fall strictly along a path
# (keeps the top-`budget` set ancestor-closed even when a draft is certain).
_MAX_LOGP = -1e-9


def _log_probs(drafter: FoveaDrafter, h_BWD: torch.Tensor, depth: int, mem: VisualMemory | None,
               correction_depth: int | None):
    depth_BW = torch.full(h_BWD.shape[:2], depth, dtype=torch.long, device=h_BWD.device)
    hidden = drafter.correct(h_BWD, depth_BW, mem, correction_depth).hidden_BSD
    return torch.log_softmax(drafter.logits(hidden).double(), dim=-1).clamp_max(_MAX_LOGP)


@torch.no_grad()
def draft_tree(drafter: FoveaDrafter, cache: RaggedCache, root_h_BD: torch.Tensor, len_B: torch.Tensor,
               mem: VisualMemory | None, cfg: TreeConfig, correction_depth: int | None = None,
               keep_BC: torch.Tensor | None = None) -> DraftTree:
    """keep_BC: which cached keys the nodes may read (None: every committed one)."""
    B, dev = root_h_BD.shape[0], root_h_BD.device
    W = min(cfg.width, drafter.lm_head.out_features)
    logp_BWV = _log_probs(drafter, root_h_BD[:, None], 0, mem, correction_depth)
    score_BW, tok_BW = logp_BWV[:, 0].topk(W, dim=-1)
    tokens, scores = [tok_BW], [score_BW]
    parents = [torch.full((B, W), -1, dtype=torch.long, device=dev)]
    depths = [torch.ones(B, W, dtype=torch.long, device=dev)]
    front_idx = torch.arange(W, device=dev).expand(B, W)        # candidate index of each frontier node
    front_tok, front_score = tok_BW, score_BW
    front_parent_h = root_h_BD[:, None].expand(B, W, -1)
    front_anc = torch.zeros(B, W, 0, dtype=torch.bool, device=dev)  # ancestors among scratch slots
    base = int(len_B.max())
    n_cand = W
    for d in range(1, cfg.depth):
        # run the frontier (depth d) through the drafter
        own = torch.eye(W, dtype=torch.bool, device=dev).expand(B, W, W)
        scratch_BWS = torch.cat([front_anc, own], dim=-1)               # (B, W, d*W)
        write_BW = len_B[:, None] + (d - 1) * W + torch.arange(W, device=dev)
        kv_len = base + d * W
        attend = prefix_and_new_mask(len_B, scratch_BWS, kv_len)
        if keep_BC is not None:
            attend = attend & keep_BC[:, None, :kv_len]
        cache.plan(write_BW, kv_len)
        x = drafter.input_states(front_tok, front_parent_h)
        h_BWD, _ = drafter.blocks(x, (len_B + d - 1)[:, None].expand(B, W), attend, cache)
        # their children
        child_lp, child_tok = _log_probs(drafter, h_BWD, d, mem, correction_depth).topk(W, dim=-1)   # (B, W, W)
        child_score = front_score[:, :, None] + child_lp
        tokens.append(child_tok.reshape(B, W * W))
        scores.append(child_score.reshape(B, W * W))
        parents.append(front_idx[:, :, None].expand(B, W, W).reshape(B, W * W))
        depths.append(torch.full((B, W * W), d + 1, dtype=torch.long, device=dev))
        # the next frontier: the W best children
        front_score, pick = child_score.reshape(B, W * W).topk(W, dim=-1)
        from_node = pick // W
        front_tok = child_tok.reshape(B, W * W).gather(1, pick)
        front_idx = n_cand + pick
        front_parent_h = h_BWD.gather(1, from_node[:, :, None].expand(B, W, h_BWD.shape[-1]))
        front_anc = scratch_BWS.gather(1, from_node[:, :, None].expand(B, W, d * W))
        n_cand += W * W
    return select_tree(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1),
                       torch.cat(depths, 1), cfg.budget)
