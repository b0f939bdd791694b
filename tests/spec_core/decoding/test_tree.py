"""TreeConfig.for_batch: the per-step tree under a cap on verified tokens."""

from __future__ import annotations

import pytest

from spec_core.decoding import TreeConfig


def test_for_batch_caps_tokens_per_step():
    cfg = TreeConfig(width=6, depth=6, budget=40, step_tokens=48)
    assert cfg.for_batch(1) == TreeConfig(6, 6, 40)                 # 47 allowed, the budget caps
    assert cfg.for_batch(4) == TreeConfig(6, 6, 11)                 # 4 x (1 + 11) = 48
    assert cfg.for_batch(16) == TreeConfig(2, 2, 2)                 # 16 x 3 = 48; no wider/deeper than 2 nodes
    assert cfg.for_batch(64) == TreeConfig(1, 1, 1)                 # never below one draft node
    for n in (1, 3, 4, 7, 16):
        t = cfg.for_batch(n)
        assert n * (1 + t.budget) <= 48 or t.budget == 1
    assert TreeConfig().for_batch(16) == TreeConfig()               # no cap: the tree as configured


def test_bad_values_are_refused():
    with pytest.raises(ValueError):
        TreeConfig(step_tokens=-1)
    with pytest.raises(ValueError):
        TreeConfig(budget=0)


def test_ancestor_mask_against_walking_the_parents():
    """anc[b, i, j] iff j is i or on i's chain of parents up to the root; a self-parented pad is
    its own only ancestor."""
    import random

    import torch

    from spec_core.decoding.tree import ancestor_mask

    rng = random.Random(0)
    for _ in range(50):
        B, N = rng.randrange(1, 4), rng.randrange(0, 30)
        parent = [[0] * N for _ in range(B)]
        depth = 0
        for b in range(B):
            real = rng.randrange(0, N + 1)
            for i in range(1, N + 1):
                parent[b][i - 1] = rng.randrange(0, i) if i <= real else i  # pads: their own parent
        want = torch.zeros(B, N + 1, N + 1, dtype=torch.bool)
        for b in range(B):
            for i in range(N + 1):
                j, d = i, 0
                want[b, i, i] = True
                while j and parent[b][j - 1] != j:
                    j, d = parent[b][j - 1], d + 1
                    want[b, i, j] = True
                depth = max(depth, d)
        assert torch.equal(ancestor_mask(torch.tensor(parent, dtype=torch.long).reshape(B, N), depth), want)


def test_walk_against_stepping_from_the_root():
    """The batched walk against the rule itself, node by node in Python: from the root, move to
    the first child carrying the target's token there, else stop. Random trees with repeated
    sibling tokens (the first sibling wins), pads (self-parented, carrying tokens the target
    picks) and small vocabularies, so that many nodes match."""
    import random

    import torch

    from spec_core.decoding.tree import DraftTree, ancestor_mask, walk

    rng = random.Random(1)
    for _ in range(300):
        B, N, V = rng.randrange(1, 5), rng.randrange(1, 25), rng.randrange(1, 4)
        parent, depth, tokens, want = [], [], [], []
        for _ in range(B):
            n = rng.randrange(0, N + 1)  # real nodes of this row; the rest are pads
            par = [rng.randrange(0, i) for i in range(1, n + 1)] + list(range(n + 1, N + 1))
            dep = []
            for p in par[:n]:
                dep.append(dep[p - 1] + 1 if p else 1)
            parent.append(par)
            depth.append(dep + [1] * (N - n))
            tokens.append([rng.randrange(V) for _ in range(N)])
        chosen = [[rng.randrange(V) for _ in range(N + 1)] for _ in range(B)]
        for b in range(B):
            node, path = 0, []
            n_real = sum(1 for i, p in enumerate(parent[b], start=1) if p != i)
            while True:
                kids = [i for i in range(1, n_real + 1) if parent[b][i - 1] == node
                        and tokens[b][i - 1] == chosen[b][node]]
                if not kids:
                    break
                node = kids[0]
                path.append(node)
            want.append(path)
        parent_BN = torch.tensor(parent)
        depth_BN = torch.tensor(depth)
        tree = DraftTree(torch.tensor(tokens), parent_BN, depth_BN, ancestor_mask(parent_BN, int(depth_BN.max())))
        path_BD, n_B = walk(tree, torch.tensor(chosen))
        assert path_BD.shape == (B, int(depth_BN.max()))
        for b in range(B):
            assert n_B[b].item() == len(want[b])
            assert path_BD[b].tolist() == want[b] + [-1] * (path_BD.shape[1] - len(want[b]))
