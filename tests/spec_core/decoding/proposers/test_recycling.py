"""TokenRecycling: update semantics against a sequential loop, and drafts against hand- and
recursively-expanded trees."""

from __future__ import annotations

import random

import pytest
import torch

from spec_core.decoding.proposers import RECYCLING_TEMPLATE, TokenRecycling, paths_to_tree
from spec_core.decoding.proposers.recycling import template_nodes


def test_update_overwrites_rows_in_order():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        V, k, T = 12, 3, 9
        tr = TokenRecycling(V, k, template=(1, 0))
        want = [[-1] * k for _ in range(V)]
        for _ in range(3):
            tokens = torch.randint(0, V, (T,), generator=g)      # repeats: the later position wins
            logits = torch.randn(T, V, generator=g)
            tr.update(tokens, logits)
            for t in range(T):
                want[int(tokens[t])] = logits[t].argsort(descending=True)[:k].tolist()
            assert tr.adj_VK.tolist() == want
        one = int(tokens[0])  # an AR step's root: one row from a top-k computed for the batch
        tr.learn(one, logits[0].topk(k).indices)
        want[one] = logits[0].argsort(descending=True)[:k].tolist()
        assert tr.adj_VK.tolist() == want


def test_default_template_is_token_recyclings_80_node_tree():
    parent, rank, depth = template_nodes(RECYCLING_TEMPLATE)
    assert len(parent) == 80 and max(depth) == 6 and max(rank) == 7
    assert parent[:8] == [0] * 8 and all(p < i for i, p in enumerate(parent, start=1))
    with pytest.raises(ValueError):
        template_nodes((1, 0, 2))    # node 2 has no parent
    with pytest.raises(ValueError):
        TokenRecycling(10, k=2)      # the default template needs k >= 8


def test_hand_expanded_tree():
    tr = TokenRecycling(6, k=2, template=(2, 2, 1, 0, 0, 0))   # root -> 1, 2; 1 -> 3, 4; 2 -> 5
    tr.adj_VK[0] = torch.tensor([1, 2])
    tr.adj_VK[1] = torch.tensor([3, 4])
    tr.adj_VK[2] = torch.tensor([5, 0])
    tr.reset([4, 0])
    assert tr.propose(10) == [[1, 3], [1, 4], [2, 5]]
    assert tr.propose(3) == [[1, 3], [2]]          # the template's first 3 nodes (BFS)
    tr.extend([1])                                 # from token 1: row 3, 4 unknown -> no grandchildren
    assert tr.propose(10) == [[3], [4]]
    tr.adj_VK[2] = -1
    tr.reset([0])
    assert tr.propose(10) == [[1, 3], [1, 4], [2]]
    tr.reset([5])                                  # an unseen token drafts nothing
    assert tr.propose(10) == []


def _random_recycling(rng: random.Random, V: int, k: int, unknown: int) -> tuple[TokenRecycling, torch.Tensor]:
    """The default template over a random matrix with `unknown` rows not yet seen."""
    adj = torch.stack([torch.randperm(V)[:k] for _ in range(V)])
    for v in rng.sample(range(V), unknown):
        adj[v] = -1
    return TokenRecycling(V, k, adj_VK=adj.clone()), adj


def test_default_template_against_recursive_expansion():
    rng = random.Random(0)
    parent, rank, _ = template_nodes(RECYCLING_TEMPLATE)
    V, k = 20, 8
    for _ in range(30):
        tr, adj = _random_recycling(rng, V, k, unknown=6)
        root, budget = rng.randrange(V), rng.randrange(1, 90)
        tr.reset([root])
        # oracle: node i's token is row(parent token)[rank i], over the first `budget` nodes
        tok = [root]
        for i in range(min(budget, 80)):
            p = tok[parent[i]]
            tok.append(int(adj[p, rank[i]]) if p >= 0 else -1)
        seqs, want = [()], set()
        for i in range(1, len(tok)):
            seqs.append(seqs[parent[i - 1]] + (tok[i],))
            if tok[i] >= 0:
                want.add(seqs[i])
        paths = tr.propose(budget)
        tokens, par, _ = paths_to_tree(paths, budget)
        got = [()]
        for t, p in zip(tokens, par):
            got.append(got[p] + (t,))
        assert set(got[1:]) == want and len(got) - 1 == len(want)
        assert not paths or paths[0] == [tok[j] for j in (1, 9, 30, 55, 70, 78) if j < len(tok)][: len(paths[0])]


def test_matrix_survives_reset_and_is_shareable():
    shared = torch.full((5, 2), -1, dtype=torch.long)
    a, b = TokenRecycling(5, 2, template=(1, 0), adj_VK=shared), TokenRecycling(5, 2, template=(1, 0), adj_VK=shared)
    a.update(torch.tensor([3]), torch.tensor([[0.0, 1.0, 5.0, 2.0, 0.5]]))
    a.reset([3])
    b.reset([3])
    assert a.propose(4) == b.propose(4) == [[2]]


def test_one_write_for_all_slots_equals_writing_slot_after_slot():
    """The engine writes a step's verified positions of every slot sharing the matrix at once, in
    slot order: the same matrix as each slot's proposer writing its own rows in turn."""
    g = torch.Generator().manual_seed(1)
    V, k = 10, 3
    for _ in range(30):
        slots = [(torch.randint(0, V, (int(n),), generator=g), torch.randn(int(n), V, generator=g))
                 for n in torch.randint(1, 6, (4,), generator=g)]
        seq, once = TokenRecycling(V, k, template=(1, 0)), TokenRecycling(V, k, template=(1, 0))
        for tokens, logits in slots:
            seq.update(tokens, logits)
        once.learn(torch.cat([t for t, _ in slots]), torch.cat([lg for _, lg in slots]).topk(k, dim=-1).indices)
        assert torch.equal(seq.adj_VK, once.adj_VK)


def test_learn_rows_resolves_repeats_as_the_tensor_path():
    """An AR step's rows (host ids, repeats among them): the last of a repeated token wins, as
    `learn` on the same tokens as a tensor."""
    g = torch.Generator().manual_seed(2)
    V, k = 12, 3
    for _ in range(30):
        tokens = torch.randint(0, 5, (8,), generator=g)  # few ids: repeats
        top_TK = torch.randn(8, V, generator=g).topk(k, dim=-1).indices
        a, b = TokenRecycling(V, k, template=(1, 0)), TokenRecycling(V, k, template=(1, 0))
        a.learn(tokens, top_TK)
        b.learn_rows(tokens.tolist(), top_TK)
        assert torch.equal(a.adj_VK, b.adj_VK)


def test_propose_tree_is_the_paths_tree_in_template_order():
    """propose_tree holds the nodes of the tree merged from propose's paths, in the template's
    breadth-first order, so that its first n nodes are the draft of budget n."""
    rng = random.Random(1)
    V, k = 20, 8
    for _ in range(30):
        tr, _ = _random_recycling(rng, V, k, unknown=4)
        tr.reset([rng.randrange(V)])
        budget = rng.randrange(1, 90)

        def seqs(tree):  # each node as its token sequence from the root
            out = [()]
            for t, p in zip(tree[0], tree[1]):
                out.append(out[p] + (t,))
            return out[1:]

        tree = tr.propose_tree(budget)
        assert set(seqs(tree)) == set(seqs(paths_to_tree(tr.propose(budget), budget)))
        assert len(seqs(tree)) == len(set(seqs(tree)))
        assert all(p < i for i, p in enumerate(tree[1], start=1))                 # topological
        assert [len(s) for s in seqs(tree)] == tree[2] == sorted(tree[2])          # breadth-first
        for n in range(1, budget + 1):   # a prefix is the smaller draft where every node is known
            small = tr.propose_tree(n)
            assert seqs(small) == seqs(tree)[: len(small[0])]


def test_batch_tree_is_every_slots_tree_padded():
    """Slots sharing one matrix draft at once: the same `DraftTree` as each slot's `propose_tree`
    padded by `trees_to_batch` (empty slots, an unknown last token, unknown rows, any budget)."""
    from spec_core.decoding.proposers import propose_batch, trees_to_batch

    rng = random.Random(3)
    V, k = 20, 8
    for _ in range(40):
        tr, _ = _random_recycling(rng, V, k, unknown=rng.choice([0, 4, 12]))
        slots = []
        for _ in range(rng.randrange(1, 7)):
            p = None if rng.random() < 0.2 else TokenRecycling(V, k, adj_VK=tr.adj_VK)
            if p is not None:
                p.reset([] if rng.random() < 0.1 else [rng.randrange(V)])
            slots.append(p)
        budget = rng.randrange(0, 90)
        want = trees_to_batch([([], [], []) if p is None else p.propose_tree(budget) for p in slots])
        got = propose_batch(slots, budget)
        if all(p is None for p in slots):
            assert got.size == 0
            continue
        direct = TokenRecycling.batch_tree(slots, budget)
        for tree in (got, direct):
            for name in ("tokens_BN", "parent_BN", "depth_BN", "anc_BMM"):
                assert torch.equal(getattr(tree, name), getattr(want, name)), name


def test_batch_tree_of_a_warm_matrix_is_the_template_prefix_in_every_row():
    """Every row known (the common case once the matrix has seen the vocabulary): the batch is the
    template's first `budget` nodes in every row, as each slot's own tree padded would be."""
    from spec_core.decoding.proposers import trees_to_batch

    rng = random.Random(5)
    V, k = 20, 8
    for budget in (1, 3, 8, 29, 80, 200):
        tr, _ = _random_recycling(rng, V, k, unknown=0)
        slots = [TokenRecycling(V, k, adj_VK=tr.adj_VK) for _ in range(3)]
        for p in slots:
            p.reset([rng.randrange(V)])
        want = trees_to_batch([p.propose_tree(budget) for p in slots])
        got = TokenRecycling.batch_tree(slots, budget)
        assert got.size == min(budget, len(tr.parent))
        for name in ("tokens_BN", "parent_BN", "depth_BN", "anc_BMM"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_batch_tree_declines_other_matrices_and_templates():
    a = TokenRecycling(10, 2, template=(2, 0, 0))
    b = TokenRecycling(10, 2, template=(2, 0, 0))  # its own matrix
    c = TokenRecycling(10, 2, template=(1, 0), adj_VK=a.adj_VK)  # another template
    assert TokenRecycling.batch_tree([a, b], 4) is None
    assert TokenRecycling.batch_tree([a, None, c], 4) is None
    assert TokenRecycling.batch_tree([a, None, a], 4) is not None
