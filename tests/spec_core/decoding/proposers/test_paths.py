"""paths_to_tree against a prefix-set oracle; trees_to_batch against brute-force ancestry and the
engine's own `walk` (pads are never accepted, real paths are)."""

from __future__ import annotations

import random

import pytest
import torch

from spec_core.decoding.proposers import (LookaheadTrie, PromptLookup, Proposer, SuffixAutomaton,
                                          TokenRecycling, paths_to_tree, propose_batch, trees_to_batch)
from spec_core.decoding.tree import walk


def random_paths(rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(3) for _ in range(rng.randrange(0, 6))] for _ in range(rng.randrange(0, 7))]


def node_sequences(tree) -> list[tuple[int, ...]]:
    """Root-to-node token sequence of every node, in node order."""
    tokens, parent, _ = tree
    seqs: list[tuple[int, ...]] = [()]
    for t, p in zip(tokens, parent):
        seqs.append(seqs[p] + (t,))
    return seqs[1:]


def test_paths_to_tree_keeps_the_best_prefixes():
    rng = random.Random(0)
    for _ in range(400):
        paths, budget = random_paths(rng), rng.randrange(0, 20)
        # oracle: every distinct prefix, ranked by (first path holding it, length); the best `budget`
        first: dict[tuple[int, ...], int] = {}
        for i, p in enumerate(paths):
            for n in range(1, len(p) + 1):
                first.setdefault(tuple(p[:n]), i)
        want = sorted(first, key=lambda s: (first[s], len(s)))[:budget]
        tree = paths_to_tree(paths, budget)
        tokens, parent, depth = tree
        assert node_sequences(tree) == want
        for i, (p, d) in enumerate(zip(parent, depth), start=1):
            assert 0 <= p < i and d == len(want[i - 1])


def brute_ancestry(parent: list[int]) -> list[set[int]]:
    anc = [{0}]
    for i, p in enumerate(parent, start=1):
        anc.append(anc[p] | {i})
    return anc


def test_trees_to_batch_pads_outside_everyones_ancestry():
    rng = random.Random(1)
    for _ in range(60):
        trees = [paths_to_tree(random_paths(rng), rng.randrange(0, 12)) for _ in range(rng.randrange(1, 5))]
        dt = trees_to_batch(trees, pad_token=2)
        N = max(len(t[0]) for t in trees)
        assert dt.tokens_BN.shape == dt.parent_BN.shape == dt.depth_BN.shape == (len(trees), N)
        assert dt.anc_BMM.shape == (len(trees), N + 1, N + 1)
        for b, (tok, par, dep) in enumerate(trees):
            n = len(tok)
            anc = brute_ancestry(par)
            for i in range(N + 1):
                want = anc[i] if i <= n else {i}          # a pad sees only itself
                assert {j for j in range(N + 1) if dt.anc_BMM[b, i, j]} == want
            assert dt.tokens_BN[b, :n].tolist() == tok and dt.depth_BN[b, :n].tolist() == dep
            assert (dt.tokens_BN[b, n:] == 2).all()


def test_walk_never_accepts_a_pad_and_accepts_real_paths():
    rng = random.Random(2)
    for _ in range(100):
        paths_per = [random_paths(rng) for _ in range(3)]
        trees = [paths_to_tree(p, 10) for p in paths_per]
        dt = trees_to_batch(trees, pad_token=1)
        B, M = len(trees), dt.size + 1
        # the target always picks the pad token: no pad may be entered
        path_BD, n_B = walk(dt, torch.full((B, M), 1, dtype=torch.long))
        for b, (tok, _, _) in enumerate(trees):
            assert all(0 < i <= len(tok) for i in path_BD[b, : n_B[b]].tolist())
        # the target follows each sample's first merged path: all of it is accepted
        chosen = torch.full((B, M), 2, dtype=torch.long)
        want = []
        for b, (tok, par, _) in enumerate(trees):
            node, steps = 0, 0
            while True:
                kids = [i for i in range(1, len(tok) + 1) if par[i - 1] == node]
                if not kids:
                    break
                chosen[b, node] = tok[kids[0] - 1]
                node, steps = kids[0], steps + 1
            chosen[b, node] = 7   # no child carries 7: the walk stops here
            want.append(steps)
        _, n_B = walk(dt, chosen)
        assert n_B.tolist() == want


def test_empty_batch_and_malformed_trees():
    dt = trees_to_batch([([], [], []), ([], [], [])])
    assert dt.size == 0 and dt.anc_BMM.shape == (2, 1, 1) and bool(dt.anc_BMM.all())
    with pytest.raises(ValueError):
        trees_to_batch([([5, 6], [0, 2], [1, 2])])     # parent after the child
    with pytest.raises(ValueError):
        trees_to_batch([([5, 6], [0, 1], [1, 1])])     # wrong depth


def test_every_method_is_a_proposer_and_batches():
    methods = [PromptLookup(), SuffixAutomaton(), LookaheadTrie(), TokenRecycling(16)]
    history = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    for m in methods:
        assert isinstance(m, Proposer)
        m.reset(history)
    methods[-1].update(torch.tensor([2]), torch.arange(16.0)[None])
    dt = propose_batch(methods + [None], budget=8)
    assert dt.tokens_BN.shape[0] == 5 and dt.size <= 8
    assert dt.tokens_BN[:3, 0].tolist() == [3, 3, 3]    # all three lookups continue "1 2" with 3
    assert dt.tokens_BN[3, 0].item() == 15              # recycling: the top logit after token 2
    assert bool((dt.parent_BN[4] == torch.arange(1, dt.size + 1)).all())   # the empty slot: pads only
