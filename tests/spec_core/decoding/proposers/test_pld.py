"""PromptLookup against a brute-force scan of the history."""

from __future__ import annotations

import random

import pytest

from spec_core.decoding.proposers import PromptLookup


def brute_pld(ids: list[int], ngram: int, n_pred: int, budget: int) -> list[list[int]]:
    """Longest n <= ngram whose last-n tokens occur earlier; the most recent such occurrence; copy
    on (overlapping) from the token after it."""
    L, k = len(ids), min(n_pred, budget)
    for n in range(min(ngram, L - 1), 0, -1):
        starts = [i for i in range(0, L - n) if ids[i: i + n] == ids[L - n:]]   # ends at i+n-1 <= L-2
        if starts:
            if k <= 0:
                return []
            ext = list(ids)
            p = max(starts) + n
            for j in range(k):
                ext.append(ext[p + j])
            return [ext[L:]]
    return []


def chunks(rng: random.Random, ids: list[int]) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        j = i + rng.randrange(1, 5)
        out.append(ids[i:j])
        i = j
    return out


def test_matches_brute_force_on_random_histories():
    rng = random.Random(0)
    for _ in range(300):
        ngram, n_pred = rng.randrange(1, 5), rng.randrange(1, 11)
        ids = [rng.randrange(rng.randrange(2, 5)) for _ in range(rng.randrange(0, 40))]
        split = rng.randrange(0, len(ids) + 1)
        pld = PromptLookup(ngram, n_pred)
        pld.reset(ids[:split])
        for c in chunks(rng, ids[split:]):   # incremental extends, checked after each
            pld.extend(c)
            hist = pld.ids
            budget = rng.randrange(0, 12)
            assert pld.propose(budget) == brute_pld(hist, ngram, n_pred, budget)
        assert pld.ids == ids


def test_prefers_longest_ngram_then_most_recent_occurrence():
    pld = PromptLookup(ngram=3, n_pred=4)
    pld.reset([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3])
    assert pld.match() == (2, 7)                  # no earlier "5 2 3"; "2 3" last at 5..6
    assert pld.propose(10) == [[7, 5, 2, 3]]     # "2 3" last seen before 7 (not before 9: older)
    pld.extend([7])                               # "2 3 7" occurs at 5..7
    assert pld.propose(10) == [[5, 2, 3, 7]]
    pld.reset([4, 4, 4])                          # a run: the copy overlaps its own output
    assert pld.propose(10) == [[4, 4, 4, 4]]
    pld.reset([1, 2, 3])
    assert pld.propose(10) == []


def test_bad_config():
    with pytest.raises(ValueError):
        PromptLookup(ngram=0)
