"""The proposer interface, and candidate paths -> prefix trees -> a batched `DraftTree`.

A proposer sees one sample's token history (prompt + committed output, plain ints) and proposes
candidate continuations of it; `paths_to_tree` merges them into a prefix tree (node 0 = the root,
the history's last token) and `trees_to_batch` pads one tree per sample into a `DraftTree`.

Shapes: B batch, N draft nodes (the largest tree in the batch), M = N + 1 nodes with the root.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from spec_core.decoding.tree import DraftTree, ancestor_mask

Tree = tuple[list[int], list[int], list[int]]   # (tokens, parent, depth) of nodes 1..n


@runtime_checkable
class Proposer(Protocol):
    """A training-free drafter over one sample's token history."""

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a new sample whose history is `prompt_ids`."""

    def extend(self, new_ids: list[int]) -> None:
        """Committed tokens appended to the history (after each verification step)."""

    def propose(self, budget: int) -> list[list[int]]:
        """Candidate continuations after the history's last token, best first (may be empty).
        A proposer whose draft is a tree of its own order may also have `propose_tree(budget)`
        -> (tokens, parent, depth) of nodes 1..n, topologically ordered (Token Recycling's
        template); `propose_batch` takes that instead of merging paths."""


def paths_to_tree(paths: list[list[int]], budget: int) -> Tree:
    """Merge paths (best first) into a prefix tree of at most `budget` nodes.

    Identical prefixes share nodes; nodes are numbered 1..n in creation order, which is
    topological; parent 0 is the root. Paths are inserted best first and insertion stops at the
    budget, so whole suffixes of the lowest-priority paths are the ones dropped.
    """
    tokens: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    children: list[dict[int, int]] = [{}]   # per node 0..n: token -> node
    for path in paths:
        node = 0
        for t in path:
            nxt = children[node].get(t)
            if nxt is None:
                if len(tokens) >= budget:
                    return tokens, parent, depth
                tokens.append(int(t))
                parent.append(node)
                depth.append(depth[node - 1] + 1 if node else 1)
                nxt = len(tokens)
                children[node][t] = nxt
                children.append({})
            node = nxt
    return tokens, parent, depth


def _check(tree: Tree) -> None:
    tokens, parent, depth = tree
    if not len(tokens) == len(parent) == len(depth):
        raise ValueError("a tree's tokens, parent and depth lists must have the same length")
    for i, (p, d) in enumerate(zip(parent, depth), start=1):
        if not 0 <= p < i or d != (depth[p - 1] + 1 if p else 1):
            raise ValueError(f"node {i}: parent {p} / depth {d} is not a topologically ordered tree")


def trees_to_batch(trees: list[Tree], device=None, pad_token: int = 0) -> DraftTree:
    """One tree per sample -> a `DraftTree` padded to the largest tree's N.

    Pad node j (after a sample's real nodes) is its own parent, with token `pad_token` (a valid
    id, so the target can embed it) and depth 1. Being its own parent it sits in no one's
    ancestry but its own: anc[j] = {j} (it attends to the committed prefix and itself only) and no
    real node attends to it. `walk` moves from the current node only to a child of it, and a pad
    is the child of nothing but itself, which the walk never reaches - so a pad is never accepted,
    whatever token the target chooses. (Token -1 would not match either, but no embedding row has
    it; a real-id child of the root could match and be accepted.)
    """
    for t in trees:
        _check(t)
    B, N = len(trees), max((len(t[0]) for t in trees), default=0)
    tokens_BN = torch.full((B, N), pad_token, dtype=torch.long)
    parent_BN = torch.arange(1, N + 1, dtype=torch.long).repeat(B, 1)   # pads: their own parent
    depth_BN = torch.ones(B, N, dtype=torch.long)
    for b, (tok, par, dep) in enumerate(trees):
        n = len(tok)
        tokens_BN[b, :n] = torch.tensor(tok, dtype=torch.long)
        parent_BN[b, :n] = torch.tensor(par, dtype=torch.long)
        depth_BN[b, :n] = torch.tensor(dep, dtype=torch.long)
    max_depth = int(depth_BN.max()) if N else 0
    anc_BMM = ancestor_mask(parent_BN, max_depth)   # a self-parented pad stays {itself}
    return DraftTree(tokens_BN.to(device), parent_BN.to(device), depth_BN.to(device), anc_BMM.to(device))


def propose_batch(proposers: list[Proposer | None], budget: int, device=None, pad_token: int = 0) -> DraftTree:
    """Each proposer's paths as one padded `DraftTree`; None (an empty slot) gives no nodes.
    Proposers whose class drafts a batch at once (`batch_tree`, Token Recycling over a shared
    matrix) do so; it returns None where it does not apply."""
    live = next((p for p in proposers if p is not None), None)
    if live is not None and hasattr(type(live), "batch_tree"):
        tree = type(live).batch_tree(proposers, budget, device, pad_token)
        if tree is not None:
            return tree
    trees = [([], [], []) if p is None else p.propose_tree(budget) if hasattr(p, "propose_tree")
             else paths_to_tree(p.propose(budget), budget) for p in proposers]
    return trees_to_batch(trees, device, pad_token)
