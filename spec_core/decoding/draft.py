"""EAGLE-2-style dynamic draft trees from a FOVEA drafter, batched over samples.

The root state (the drafter's output at the last committed position, scored with correction at
depth 0) proposes `width` children. At each depth d = 1..D-1 the `width` best frontier nodes by
cumulative log-probability are run through the drafter in one forward - input [embed(token);
parent state (uncorrected, or h_hat with `feedback: corrected`)], position = root position + d - 1
(as in training, `fovea.unroll`), attending to the committed drafter cache plus the node's own
ancestors - and each proposes `width` children, scored with the corrected state when d <=
correction_depth. The `budget` best of all candidates become the tree. Frontier KV entries are
written past the longest row's committed length (scratch slots shared by every row) and never
committed: after verification the drafter re-reads the accepted tokens with the target's own
features.

Shapes: B batch, W width, D hidden, V vocabulary, C candidates, K keys.
"""

from __future__ import annotations

import torch

from spec_core.decoding.cache import RaggedCache
from spec_core.decoding.tree import DraftTree, TreeConfig, select_tree
from spec_core.fovea.correction import VisualMemory
from spec_core.fovea.drafter import FoveaDrafter
from spec_core.targets.base import additive_mask

# Child log-probabilities are capped just below 0 so that scores fall strictly along a path
# (keeps the top-`budget` set ancestor-closed even when a draft is certain).
_MAX_LOGP = -1e-9


def _top_children(drafter: FoveaDrafter, h_BWD: torch.Tensor, depth: int, mem: VisualMemory | None,
                  correction_depth: int | None, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `width` best next tokens of each state and their log-probabilities (float64, capped):
    the top of the logits less their log-sum-exp - the log-softmax's order, and its values up to
    float32 rounding, without building (and widening) one over the vocabulary per row. States deeper than the
    correction depth are scored as they are (what `correct` passes through), without a call.
    Also returns the state the next depth reads (h_hat with `feedback: corrected`, else h)."""
    h_in_BWD = h_BWD
    corr = drafter.correction
    if mem is not None and corr is not None and depth <= (
            corr.cfg.correction_depth if correction_depth is None else correction_depth):
        depth_BW = torch.full(h_BWD.shape[:2], depth, dtype=torch.long, device=h_BWD.device)
        h_BWD = drafter.correct(h_BWD, depth_BW, mem, correction_depth).hidden_BSD
    logits_BWV = drafter.logits(h_BWD).float()
    top_BWK, tok_BWK = logits_BWV.topk(width, dim=-1)
    lse_BW1 = logits_BWV.logsumexp(-1, keepdim=True)
    fed_BWD = h_BWD if drafter.cfg.feedback == "corrected" else h_in_BWD
    return (top_BWK.double() - lse_BW1.double()).clamp_max(_MAX_LOGP), tok_BWK, fed_BWD


@torch.no_grad()
def draft_tree(drafter: FoveaDrafter, cache: RaggedCache, root_h_BD: torch.Tensor, len_B: torch.Tensor,
               mem: VisualMemory | None, cfg: TreeConfig, correction_depth: int | None = None,
               keep_BC: torch.Tensor | None = None) -> DraftTree:
    """keep_BC: which cached keys the nodes may read (None: every committed one).

    Every row writes its frontiers to the same scratch slots, past the longest row (base + (d - 1)
    W + j at depth d): the cache write is one slice, and a node's mask is its row's committed
    prefix (built once per draft) followed by its ancestry among the frontiers - the keys a node
    reads are the same as at its own row's end; positions stay per row. The rotary embedding of
    every depth's positions is computed once as well: at batch 4 a depth was ~100 small tensor
    operations, most of them this bookkeeping, next to one drafter block."""
    B, dev = root_h_BD.shape[0], root_h_BD.device
    W = min(cfg.width, drafter.lm_head.out_features)
    score_BW, tok_BW, root_fed_BD = (x[:, 0] for x in _top_children(drafter, root_h_BD[:, None], 0, mem,
                                                                       correction_depth, W))
    tokens, scores = [tok_BW], [score_BW]
    parents = [torch.full((B, W), -1, dtype=torch.long, device=dev)]
    front_idx = torch.arange(W, device=dev).expand(B, W)        # candidate index of each frontier node
    front_tok, front_score = tok_BW, score_BW
    front_parent_h = root_fed_BD[:, None].expand(B, W, -1)
    front_anc = torch.zeros(B, W, 0, dtype=torch.bool, device=dev)  # ancestors among scratch slots
    n_cand, D = W, cfg.depth
    if D > 1:
        base = int(len_B.max())
        dtype = drafter.fc.weight.dtype
        seen_BK = torch.arange(base, device=dev)[None] < len_B[:, None]   # each row's committed keys
        if keep_BC is not None:
            seen_BK = seen_BK & keep_BC[:, :base]
        prefix_B1WK = additive_mask(seen_BK[:, None], dtype).expand(B, 1, W, base)
        own_BWW = torch.eye(W, dtype=torch.bool, device=dev).expand(B, W, W)
        pos_BD = len_B[:, None] + torch.arange(D - 1, device=dev)        # depth d's nodes sit at len + d - 1
        cos, sin = drafter.rotary(root_h_BD.to(dtype)[:, None], pos_BD)
    for d in range(1, D):
        # run the frontier (depth d) through the drafter
        scratch_BWS = torch.cat([front_anc, own_BWW], dim=-1)           # (B, W, d*W)
        mask_B1WK = torch.cat([prefix_B1WK, additive_mask(scratch_BWS, dtype)], -1)
        cache.plan(None, base + d * W, start=base + (d - 1) * W)
        x = drafter.input_states(front_tok, front_parent_h)
        pos_BW = pos_BD[:, d - 1: d].expand(B, W)
        emb = tuple(t[..., d - 1: d, :].expand(*t.shape[:-2], W, t.shape[-1]) for t in (cos, sin))
        h_BWD, _ = drafter.blocks(x, pos_BW, None, cache, mask=mask_B1WK, pos_emb=emb)
        # their children
        child_lp, child_tok, fed_BWD = _top_children(drafter, h_BWD, d, mem, correction_depth, W)   # (B, W, W)
        child_score = front_score[:, :, None] + child_lp
        tokens.append(child_tok.reshape(B, W * W))
        scores.append(child_score.reshape(B, W * W))
        parents.append(front_idx[:, :, None].expand(B, W, W).reshape(B, W * W))
        # the next frontier: the W best children
        front_score, pick = child_score.reshape(B, W * W).topk(W, dim=-1)
        from_node = pick // W
        front_tok = child_tok.reshape(B, W * W).gather(1, pick)
        front_idx = n_cand + pick
        front_parent_h = fed_BWD.gather(1, from_node[:, :, None].expand(B, W, h_BWD.shape[-1]))
        front_anc = scratch_BWS.gather(1, from_node[:, :, None].expand(B, W, d * W))
        n_cand += W * W
    per_depth = torch.tensor([W] + [W * W] * (D - 1), device=dev)
    depth_BC = torch.arange(1, D + 1, device=dev).repeat_interleave(per_depth).expand(B, n_cand)
    return select_tree(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1), depth_BC, cfg.budget)
