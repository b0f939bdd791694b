"""Draft trees, batched: every sample has its own tree of the same node budget.

Node 0 is the root (the last committed token, not yet verified by the target); nodes 1..N are
drafts in topological order (a parent before its children). A tree is built from scored candidate
nodes (EAGLE-2): the N best by cumulative draft log-probability form an ancestor-closed set,
because a child's score is strictly below its parent's.

Shapes: B batch, N draft nodes, M = N + 1 nodes with the root, C candidates, K keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeConfig:
    """The draft tree of a speculative method; also a method's `tree` section in the generate and
    benchmark jobs (`__pydantic_config__`: pydantic, at the jobs' boundary, rejects unknown keys;
    this module never imports pydantic)."""

    __pydantic_config__ = {"extra": "forbid"}

    width: int = 6      # K_c: children per expanded node, and nodes expanded per depth
    depth: int = 6      # D: longest draft path
    budget: int = 40    # N: draft nodes verified per step (at most, with the goodput policy)
    step_tokens: int = 0  # > 0: at most this many tokens verified per step over the batch (see for_batch)
    policy: str = "fixed"  # fixed: the budget every step | goodput: the node count that maximises
                           # expected tokens per second on this hardware, per step (decoding.goodput)

    def __post_init__(self):
        if min(self.width, self.depth, self.budget) < 1 or self.step_tokens < 0:
            raise ValueError("tree width, depth and budget must be >= 1, step_tokens >= 0")
        if self.policy not in ("fixed", "goodput"):
            raise ValueError(f"tree policy must be 'fixed' or 'goodput', got {self.policy!r}")

    def for_batch(self, n_active: int) -> TreeConfig:
        """The tree for a step with n_active samples. With step_tokens set, each sample's tree
        keeps at most step_tokens // n_active - 1 nodes (>= 1; width and depth no larger): where
        a forward's cost grows with its tokens (CPUs, large batches on GPUs), a batch of many
        samples verifies small trees and a lone sample the full one. Output is unchanged
        (any tree is lossless); only the step count and the cost per step move."""
        if not self.step_tokens:
            return self
        b = max(1, min(self.budget, self.step_tokens // max(n_active, 1) - 1))
        return TreeConfig(min(self.width, b), min(self.depth, b), b, policy=self.policy)


@dataclass
class DraftTree:
    tokens_BN: torch.Tensor    # draft tokens
    parent_BN: torch.Tensor    # index into 0..N (0: the root)
    depth_BN: torch.Tensor     # 1..D
    anc_BMM: torch.Tensor      # bool: anc[b, i, j] = node j is node i or one of its ancestors
    score_BN: torch.Tensor | None = None  # cumulative draft log-probability (drafters that score), descending

    @property
    def size(self) -> int:
        return self.tokens_BN.shape[1]

    @property
    def real_BN(self) -> torch.Tensor:
        """False on pads (a pad is its own parent)."""
        own_BN = torch.arange(1, self.size + 1, device=self.parent_BN.device)
        return self.parent_BN != own_BN


def truncate(tree: DraftTree, n: int) -> DraftTree:
    """The first n nodes of every row. Rows are ordered so that each prefix is ancestor-closed
    (`select_tree`: descending score; proposers: topological), so this is a slice."""
    if n >= tree.size:
        return tree
    return DraftTree(tree.tokens_BN[:, :n], tree.parent_BN[:, :n], tree.depth_BN[:, :n],
                     tree.anc_BMM[:, : n + 1, : n + 1],
                     None if tree.score_BN is None else tree.score_BN[:, :n])


def ancestor_mask(parent_BN: torch.Tensor, max_depth: int) -> torch.Tensor:
    """(B, N) parents (0 = root, nodes 1..N) -> (B, N+1, N+1) ancestor-or-self mask."""
    B, N = parent_BN.shape
    M = N + 1
    parent_BM = torch.cat([parent_BN.new_zeros(B, 1), parent_BN], dim=1)  # the root is its own parent
    # each node's chain of ancestors (itself first; a chain at the root, or at a self-parented pad,
    # stays there), then one scatter: on one core 0.13 ms where a (B, M, M) gather per generation
    # took 2.3 ms at B = 16, M = 81
    chain = [torch.arange(M, device=parent_BN.device).expand(B, M)]
    for _ in range(max_depth):
        chain.append(parent_BM.gather(1, chain[-1]))
    anc_BMM = torch.zeros(B, M, M, dtype=torch.bool, device=parent_BN.device)
    return anc_BMM.scatter_(2, torch.stack(chain, 2), True)


def select_tree(tokens_BC: torch.Tensor, scores_BC: torch.Tensor, parent_BC: torch.Tensor,
                depth_BC: torch.Tensor, budget: int, max_depth: int | None = None) -> DraftTree:
    """The `budget` best candidates as a tree. parent_BC: candidate index of the parent, -1 for the
    root's children. Scores must fall strictly along every path. max_depth: the deepest candidate's
    depth where the caller knows it (no device read; None: read, and the tree checked)."""
    B, C = tokens_BC.shape
    N = min(budget, C)
    sel_BN = scores_BC.topk(N, dim=-1).indices  # descending: a parent always comes before its children
    inv_BC = torch.zeros(B, C, dtype=torch.long, device=tokens_BC.device)
    inv_BC.scatter_(1, sel_BN, torch.arange(1, N + 1, device=tokens_BC.device).expand(B, N))
    cand_parent_BN = parent_BC.gather(1, sel_BN)
    parent_BN = torch.where(cand_parent_BN < 0, 0, inv_BC.gather(1, cand_parent_BN.clamp_min(0)))
    depth_BN = depth_BC.gather(1, sel_BN)
    if max_depth is None:
        assert bool(((parent_BN > 0) | (cand_parent_BN < 0)).all()), "selected set is not ancestor-closed"
        max_depth = int(depth_BN.max())
    return DraftTree(tokens_BC.gather(1, sel_BN), parent_BN, depth_BN,
                     ancestor_mask(parent_BN, max_depth), scores_BC.gather(1, sel_BN))


def prefix_and_new_mask(len_B: torch.Tensor, anc_BQN: torch.Tensor, kv_len: int) -> torch.Tensor:
    """(B, Q, K) bool: each row's committed prefix (keys < len[b]) plus, among the N new slots
    written at len[b] + j, those that anc[b, q, j] allows (a query's ancestry, itself included)."""
    B, Q, N = anc_BQN.shape
    rel_BK = torch.arange(kv_len, device=len_B.device)[None] - len_B[:, None]  # slot index among the new ones
    committed = (rel_BK < 0)[:, None, :].expand(B, Q, kv_len)
    in_new = (rel_BK >= 0) & (rel_BK < N)
    return committed | (in_new[:, None, :] & anc_BQN.gather(2, rel_BK.clamp(0, N - 1)[:, None, :].expand(B, Q, kv_len)))


def empty_tree(batch: int, device=None) -> DraftTree:
    """No drafts (autoregressive decoding is verification of the root alone)."""
    z = torch.zeros(batch, 0, dtype=torch.long, device=device)
    return DraftTree(z, z, z, torch.ones(batch, 1, 1, dtype=torch.bool, device=device))


def pad_tree(tree: DraftTree, n: int) -> DraftTree:
    """The tree with pads appended up to n nodes per row (a compiled step's token bucket): a pad
    is its own parent, at depth 1, and sees only itself - never reached by `walk`."""
    B, N = tree.tokens_BN.shape
    if n <= N:
        return tree
    dev = tree.tokens_BN.device
    own_BP = torch.arange(N + 1, n + 1, device=dev).expand(B, n - N)   # P = n - N pads
    anc_BMM = torch.zeros(B, n + 1, n + 1, dtype=torch.bool, device=dev)
    anc_BMM[:, : N + 1, : N + 1] = tree.anc_BMM
    anc_BMM[:, N + 1:, N + 1:] = torch.eye(n - N, dtype=torch.bool, device=dev)
    score = None if tree.score_BN is None else torch.cat(
        [tree.score_BN, tree.score_BN.new_full((B, n - N), -torch.inf)], 1)
    return DraftTree(torch.cat([tree.tokens_BN, torch.zeros_like(own_BP)], 1), torch.cat([tree.parent_BN, own_BP], 1),
                     torch.cat([tree.depth_BN, torch.ones_like(own_BP)], 1), anc_BMM, score)


def drop_rows(tree: DraftTree, rows_B: torch.Tensor) -> DraftTree:
    """The same tree with every node of the rows in rows_B (bool) turned into a pad: its own
    parent, depth 1, seeing only itself - never reached by `walk`, so never accepted."""
    B, N = tree.tokens_BN.shape
    own_BN = torch.arange(1, N + 1, device=tree.parent_BN.device).expand(B, N)
    drop_BN = rows_B[:, None].expand(B, N)
    anc = tree.anc_BMM.clone()
    eye = torch.eye(N + 1, dtype=torch.bool, device=anc.device)
    anc[rows_B] = eye
    return DraftTree(tree.tokens_BN, torch.where(drop_BN, own_BN, tree.parent_BN),
                     torch.where(drop_BN, torch.ones_like(tree.depth_BN), tree.depth_BN), anc, tree.score_BN)


def walk(tree: DraftTree, chosen_BM: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow the target's choices from the root: at node i the target emits chosen[i]; if a child
    of i carries that token the walk moves there (the first such child), else chosen[i] is the
    bonus token and it stops. Returns (path_BD: accepted node indices in order, -1 padded;
    n_accepted_B).

    All depths at once, no loop over them: a node is taken when its token is the target's choice
    at its parent and no earlier sibling's is; it is accepted when it and every ancestor are taken.
    The accepted nodes form one chain, one per depth, so each lands in its depth's column (on one
    core ~4x fewer tensor ops than stepping depth by depth, the walk's cost)."""
    B, N = tree.tokens_BN.shape
    dev = chosen_BM.device
    D = int(tree.depth_BN.max()) if N else 0
    if N == 0:
        return chosen_BM.new_zeros(B, 0), chosen_BM.new_zeros(B)
    real_BN = tree.real_BN  # a pad is its own parent: never a child of the walk's node
    match_BN = (tree.tokens_BN == chosen_BM.gather(1, tree.parent_BN)) & real_BN
    # an earlier sibling (same parent, lower index) that matches too takes precedence
    earlier_NN = torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)
    shadowed_BN = ((tree.parent_BN[:, :, None] == tree.parent_BN[:, None, :]) & earlier_NN
                   & match_BN[:, None, :]).any(-1)
    taken_BN = match_BN & ~shadowed_BN
    accepted_BN = ~(tree.anc_BMM[:, 1:, 1:] & ~taken_BN[:, None, :]).any(-1)
    column_BN = torch.where(accepted_BN, tree.depth_BN - 1, D)  # column D: not on the path
    path = torch.full((B, D + 1), -1, dtype=torch.long, device=dev)
    path.scatter_(1, column_BN, torch.arange(1, N + 1, device=dev).expand(B, N))
    return path[:, :D], accepted_BN.sum(1)
