"""EAGLE-2-style dynamic draft trees from a FOVEA drafter, batched over samples.

The root state (the drafter's output at the last committed position, scored with correction at
depth 0) proposes `width` children. At each depth d = 1..D-1 the `width` best frontier nodes by
cumulative log-probability are run through the drafter in one forward - input [embed(token);
parent state (uncorrected, or h_hat with `feedback: corrected`)], position = root position + d - 1
(as in training, `fovea.unroll`), attending to the committed drafter cache plus the node's own
ancestors - and each proposes `width` children, scored with the corrected state when d <=
correction_depth. The `budget` best of all candidates become the tree. Frontier KV entries are
written past each row's committed length, at len + (d - 1) W + j, and never committed: after
verification the drafter re-reads the accepted tokens with the target's own features.

One depth is one fixed-shape function of tensors (`draft_depth`, a compiled step in
`decoding.compiled`): the depth d enters as a tensor and the frontier's ancestry is kept over all
(D - 1) W scratch slots of the draft, so every depth of a draft has the same shapes and one graph
serves them all (one more where the depth is corrected).

Shapes: B batch, W width, D hidden, V vocabulary, C candidates, K keys, X = (depth - 1) W
scratch slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from spec_core.decoding.cache import RaggedCache
from spec_core.decoding.compiled import mark_dynamic
from spec_core.decoding.tree import DraftTree, TreeConfig, prefix_and_new_mask, select_tree
from spec_core.fovea.correction import VisualMemory
from spec_core.fovea.drafter import FoveaDrafter

# Child log-probabilities are capped just below 0 so that scores fall strictly along a path
# (keeps the top-`budget` set ancestor-closed even when a draft is certain).
_MAX_LOGP = -1e-9


class Frontier(NamedTuple):
    """The `width` best nodes of the last expanded depth of every row."""

    tok_BW: torch.Tensor       # their tokens
    score_BW: torch.Tensor     # cumulative draft log-probability (float64)
    idx_BW: torch.Tensor       # candidate index
    fed_BWD: torch.Tensor      # the parent state each feeds the drafter with
    anc_BWX: torch.Tensor      # bool: which scratch slots hold their ancestors


def _top_children(drafter: FoveaDrafter, h_BWD: torch.Tensor, depth_BW: torch.Tensor, corrected: bool,
                  mem: VisualMemory | None, correction_depth: int | None,
                  width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `width` best next tokens of each state and their log-probabilities (float64, capped):
    the top of the logits less their log-sum-exp - the log-softmax's order, and its values up to
    float32 rounding, without building (and widening) one over the vocabulary per row. States deeper
    than the correction depth (`corrected` False) are scored as they are (what `correct` passes
    through), without a call. Also returns the state the next depth reads (h_hat with `feedback:
    corrected`, else h)."""
    h_in_BWD = h_BWD
    if corrected:
        h_BWD = drafter.correct(h_BWD, depth_BW, mem, correction_depth).hidden_BSD
    logits_BWV = drafter.logits(h_BWD).float()
    top_BWK, tok_BWK = logits_BWV.topk(width, dim=-1)
    lse_BW1 = logits_BWV.logsumexp(-1, keepdim=True)
    fed_BWD = h_BWD if drafter.cfg.feedback == "corrected" else h_in_BWD
    return (top_BWK.double() - lse_BW1.double()).clamp_max(_MAX_LOGP), tok_BWK, fed_BWD


def corrects(drafter: FoveaDrafter, mem: VisualMemory | None, depth: int, correction_depth: int | None) -> bool:
    """Whether states at draft depth `depth` are scored corrected."""
    corr = drafter.correction
    return mem is not None and corr is not None and depth <= (
        corr.cfg.correction_depth if correction_depth is None else correction_depth)


def draft_root(drafter: FoveaDrafter, root_h_BD: torch.Tensor, mem: VisualMemory | None, corrected: bool,
               correction_depth: int | None, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depth 0: the root's `width` best children, best first -> (scores (B, width), tokens (B,
    width), the state the next depth reads (B, D)); a narrower draft takes the first W of them."""
    zero_B1 = torch.zeros(root_h_BD.shape[0], 1, dtype=torch.long, device=root_h_BD.device)
    score_B1W, tok_B1W, fed_B1D = _top_children(drafter, root_h_BD[:, None], zero_B1, corrected, mem,
                                                correction_depth, width)
    return score_B1W[:, 0], tok_B1W[:, 0], fed_B1D[:, 0]


def draft_depth(drafter: FoveaDrafter, cache: RaggedCache, mem: VisualMemory | None, corrected: bool,
                correction_depth: int | None, front: Frontier, d: torch.Tensor, len_B: torch.Tensor,
                keep_BC: torch.Tensor | None, keys_K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Frontier]:
    """Depth d (a 0-dim tensor, >= 1): run the frontier through the drafter, score its children.
    -> (children's tokens (B, W*W), their scores (B, W*W), the next frontier: the W best children).
    Frontier node j writes scratch slot (d - 1) W + j of its row; it sees its row's committed keys
    (those keep_BC allows) and its ancestors' and its own scratch slots."""
    B, W = front.tok_BW.shape
    X, dev = front.anc_BWX.shape[-1], front.tok_BW.device
    K = keys_K.shape[0]
    slot_W = (d - 1) * W + torch.arange(W, device=dev)                       # each node's scratch slot
    anc_BWX = front.anc_BWX | (torch.arange(X, device=dev) == slot_W[:, None])  # ancestors and itself
    attend_BWK = prefix_and_new_mask(len_B, anc_BWX, K)
    if keep_BC is not None:  # the prompt's keys a compressed context masks (keep is True past the prompt)
        attend_BWK = attend_BWK & keep_BC[:, None, :K]
    cache.plan_step(len_B[:, None] + slot_W, K)
    pos_BW = (len_B + d - 1)[:, None].expand(B, W)                          # depth d's nodes at len + d - 1
    h_BWD, _ = drafter.blocks(drafter.input_states(front.tok_BW, front.fed_BWD), pos_BW, attend_BWK, cache)
    cache.end_step()
    child_lp, child_tok, fed_BWD = _top_children(drafter, h_BWD, d.expand(B, W), corrected, mem, correction_depth, W)
    child_score_BC = (front.score_BW[:, :, None] + child_lp).reshape(B, W * W)  # (B, W, W) -> (B, W*W)
    child_tok_BC = child_tok.reshape(B, W * W)
    score_BW, pick_BW = child_score_BC.topk(W, dim=-1)
    from_BW = pick_BW // W
    n_cand = W + (d - 1) * W * W                                             # candidates before this depth's
    nxt = Frontier(child_tok_BC.gather(1, pick_BW), score_BW, n_cand + pick_BW,
                   fed_BWD.gather(1, from_BW[:, :, None].expand(B, W, h_BWD.shape[-1])),
                   anc_BWX.gather(1, from_BW[:, :, None].expand(B, W, X)))
    return child_tok_BC, child_score_BC, nxt


RunFn = Callable[..., object]  # run(fn, corrected, *args) -> fn(*args): how a draft's pieces run (compiled steps)


@torch.no_grad()
def draft_tree(drafter: FoveaDrafter, cache: RaggedCache, root_h_BD: torch.Tensor, len_B: torch.Tensor,
               mem: VisualMemory | None, cfg: TreeConfig, correction_depth: int | None = None,
               keep_BC: torch.Tensor | None = None, *, kv_len: int | None = None,
               run: RunFn | None = None, max_depth: int | None = None, root_width: int | None = None) -> DraftTree:
    """keep_BC: which cached keys the nodes may read (None: every committed one).

    kv_len: keys a depth reads (>= the longest row + (max_depth - 1) W; None: read from len_B, a
    host sync); run(fn, corrected, *args): how `draft_root` and `draft_depth` run (compiled steps
    named by the function and whether it corrects; None: called as they are); max_depth: the
    deepest draft the caller runs (None: cfg.depth) - the scratch slots are sized for it, so that a
    shallower draft has a depth's shapes (a compiled depth's graph serves every planned depth);
    root_width: the widest draft the caller runs (the root's children are scored at it, and a
    narrower draft takes the first W: one shape)."""
    run = run or (lambda fn, corrected, *args: fn(*args))
    B, dev = root_h_BD.shape[0], root_h_BD.device
    W, D = min(cfg.width, drafter.lm_head.out_features), cfg.depth
    X = (max(max_depth or D, D) - 1) * W
    corrected = corrects(drafter, mem, 0, correction_depth)
    widest = min(max(root_width or W, W), drafter.lm_head.out_features)
    score_BK, tok_BK, fed_BD = run(draft_root, corrected, drafter, root_h_BD, mem, corrected, correction_depth, widest)
    score_BW, tok_BW = score_BK[:, :W], tok_BK[:, :W]  # the first W of the widest draft's (best first)
    front = Frontier(tok_BW, score_BW, torch.arange(W, device=dev).repeat(B, 1), fed_BD[:, None].repeat(1, W, 1),
                     torch.zeros(B, W, X, dtype=torch.bool, device=dev))
    tokens, scores, parents = [front.tok_BW], [front.score_BW], [torch.full((B, W), -1, dtype=torch.long, device=dev)]
    if D > 1:
        K = kv_len if kv_len is not None else int(len_B.max()) + X
        cache.reserve(K)
        keys_K, d_D = mark_dynamic(torch.arange(K, device=dev), 0), torch.arange(D, device=dev)
        for d in range(1, D):
            corrected = corrects(drafter, mem, d, correction_depth)
            front = Frontier(*(mark_dynamic(t, *dims)  # widths and scratch sizes vary
                               for t, dims in zip(front, ((1,), (1,), (1,), (1,), (1, 2)))))
            parents.append(front.idx_BW[:, :, None].expand(B, W, W).reshape(B, W * W))
            tok, score, front = run(draft_depth, corrected, drafter, cache, mem, corrected, correction_depth, front,
                                    d_D[d], len_B, keep_BC, keys_K)
            tokens.append(tok)
            scores.append(score)
    per_depth = torch.tensor([W] + [W * W] * (D - 1), device=dev)
    depth_BC = torch.arange(1, D + 1, device=dev).repeat_interleave(per_depth).expand(B, -1)
    return select_tree(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1), depth_BC, cfg.budget,
                       max_depth=D)


def catch_up(drafter: FoveaDrafter, cache: RaggedCache, tokens_BA: torch.Tensor, feats_BAD: torch.Tensor,
             n_B: torch.Tensor, len_B: torch.Tensor, keep_BC: torch.Tensor | None, root_h_BD: torch.Tensor,
             keys_K: torch.Tensor) -> torch.Tensor:
    """Feed n_B committed tokens per row, with the target's features, at the drafter cache's end
    (len_B; entries past n_B are scratch) -> the new root state: the output at n_B - 1 (rows fed
    nothing keep theirs). The caller advances len_B by n_B."""
    B, A = tokens_BA.shape
    K = keys_K.shape[0]
    causal_BAA = torch.ones(A, A, dtype=torch.bool, device=tokens_BA.device).tril().expand(B, A, A)
    attend_BAK = prefix_and_new_mask(len_B, causal_BAA, K)
    if keep_BC is not None:
        attend_BAK = attend_BAK & keep_BC[:, None, :K]
    pos_BA = len_B[:, None] + torch.arange(A, device=tokens_BA.device)
    cache.plan_step(pos_BA, K)
    h_BAD, _ = drafter.blocks(drafter.input_states(tokens_BA, feats_BAD.to(drafter.fc.weight.dtype)), pos_BA,
                              attend_BAK, cache)
    cache.end_step()
    last_BD = h_BAD[torch.arange(B, device=h_BAD.device), (n_B - 1).clamp_min(0)]
    return torch.where((n_B > 0)[:, None], last_BD.to(root_h_BD.dtype), root_h_BD)
