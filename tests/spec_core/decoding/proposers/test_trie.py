"""LookaheadTrie against brute-force n-gram counting: the longest earlier-occurring suffix, and the
depth-first, most-frequent-first tree of what followed it."""

from __future__ import annotations

import random

import pytest

from spec_core.decoding.proposers import LookaheadTrie, paths_to_tree


def occurrences(x: list[int], h: list[int]) -> list[int]:
    """End indices of x in h."""
    n = len(x)
    return [i + n - 1 for i in range(len(h) - n + 1) if h[i: i + n] == x]


def brute_lookahead(h: list[int], decoding_length: int, branch_length: int, max_match: int,
                    budget: int) -> tuple[int, list[list[int]]]:
    L = len(h)
    for m in range(min(max_match, L - 1), 0, -1):
        s = h[L - m:]
        ends = [e for e in occurrences(s, h) if e <= L - 2]
        if ends:
            break
    else:
        return 0, []
    # every continuation (up to branch_length) of an earlier occurrence, with the count and the
    # latest end of (suffix + continuation) in the whole history
    conts = {tuple(h[e + 1: e + 1 + j]) for e in ends for j in range(1, branch_length + 1) if e + j <= L - 1}

    def key(c: tuple[int, ...]):
        occ = occurrences(s + list(c), h)
        return -len(occ), -occ[-1]

    left, paths = min(decoding_length, budget), []

    def dfs(prefix: tuple[int, ...]) -> None:
        nonlocal left
        kids = sorted((c for c in conts if len(c) == len(prefix) + 1 and c[:-1] == prefix), key=key)
        taken = False
        for c in kids:
            if left == 0:
                break
            left -= 1
            taken = True
            dfs(c)
        if not taken and prefix:
            paths.append(list(prefix))

    if left > 0:
        dfs(())
    return m, paths


def test_matches_brute_force_on_random_histories():
    rng = random.Random(0)
    for _ in range(250):
        dl, bl, mm = rng.randrange(1, 16), rng.randrange(1, 6), rng.randrange(1, 4)
        h = [rng.randrange(rng.randrange(2, 5)) for _ in range(rng.randrange(0, 35))]
        trie = LookaheadTrie(dl, bl, mm)
        split = rng.randrange(0, len(h) + 1)
        trie.reset(h[:split])
        i = split
        while i < len(h):
            j = min(i + rng.randrange(1, 6), len(h))
            trie.extend(h[i:j])
            i = j
            cur, budget = h[:i], rng.randrange(0, 20)
            m, want = brute_lookahead(cur, dl, bl, mm, budget)
            got = trie.propose(budget)
            assert trie.match()[0] == m
            assert got == want
            s = cur[len(cur) - m:]
            for p in got:   # each branch is text that really followed an occurrence of the suffix
                assert 1 <= len(p) <= bl and occurrences(s + p, cur)
            assert len(paths_to_tree(got, budget)[0]) <= min(dl, budget)


def test_frequencies_order_the_branches():
    h = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 5, 1, 2]
    trie = LookaheadTrie(decoding_length=8, branch_length=2, max_match=2)
    trie.reset(h)
    # after "1 2": 3 (twice), then 5 (once, latest), then 4 (once, older)
    assert [p[0] for p in trie.propose(8)] == [3, 5, 4]
    assert trie.propose(8)[0] == [3, 1]
    assert trie.propose(1) == [[3]]
    with pytest.raises(ValueError):
        LookaheadTrie(branch_length=0)
