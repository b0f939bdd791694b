"""SuffixAutomaton against brute-force substring search: the automaton recognises exactly the
substrings with their first occurrence, the dynamic match is the longest suffix with an earlier
occurrence, the static one the longest suffix found in the corpus, and the drafts follow them."""

from __future__ import annotations

import itertools
import random

import pytest

from spec_core.decoding.proposers import StaticCorpus, SuffixAutomaton
from spec_core.decoding.proposers.suffix_automaton import SEP, Automaton


def ends_of(x: list[int], text: list[int]) -> list[int]:
    """End indices of every occurrence of x in text."""
    n = len(x)
    return [i + n - 1 for i in range(len(text) - n + 1) if text[i: i + n] == x]


def random_text(rng: random.Random, max_len: int = 40) -> list[int]:
    a = rng.randrange(2, 5)
    return [rng.randrange(a) for _ in range(rng.randrange(0, max_len))]


def test_automaton_recognises_exactly_the_substrings():
    rng = random.Random(0)
    for _ in range(150):
        text = random_text(rng, 30)
        sam = Automaton()
        for t in text:
            sam.add(t)
        assert len(sam.length) <= max(2 * len(text) - 1, len(text) + 1)   # root included
        for n in range(1, 5):
            for x in itertools.product(range(4), repeat=n):
                s = 0
                for t in x:
                    s = sam.next[s].get(t, -1)
                    if s < 0:
                        break
                ends = ends_of(list(x), text)
                assert (s >= 0) == bool(ends)
                if ends:   # the state holds x and remembers its first occurrence
                    assert sam.length[sam.link[s]] < n <= sam.length[s]
                    assert sam.first[s] == ends[0]


def brute_dynamic(h: list[int], k: int) -> tuple[int, list[int]]:
    """Longest suffix of h ending also at an earlier position; text after its first occurrence."""
    L = len(h)
    for m in range(L - 1, 0, -1):
        ends = [e for e in ends_of(h[L - m:], h) if e <= L - 2]
        if ends:
            return m, h[ends[0] + 1: ends[0] + 1 + k]
    return 0, []


def test_dynamic_match_is_the_longest_earlier_suffix():
    rng = random.Random(1)
    for _ in range(250):
        h = random_text(rng)
        max_len = rng.randrange(1, 12)
        sam = SuffixAutomaton(max_len=max_len)
        split = rng.randrange(0, len(h) + 1)
        sam.reset(h[:split])
        i = split
        while i < len(h):
            j = i + rng.randrange(1, 4)
            sam.extend(h[i:j])
            i = min(j, len(h))
            cur = h[:i]
            budget = rng.randrange(1, 12)
            m, cont = brute_dynamic(cur, min(max_len, budget))
            assert sam.match_length()[0] == m
            assert sam.propose(budget) == ([cont] if m else [])
            if m:   # the draft is text that followed an earlier occurrence of the matched suffix
                assert any(cur[s: s + m + len(cont)] == cur[len(cur) - m:] + cont
                           for s in range(len(cur) - m))
            s, n = sam.dyn   # the match state is the class of the matched string
            assert s == 0 or sam.sam.length[sam.sam.link[s]] < n <= sam.sam.length[s]
        # online extends build the same automaton as one pass over the whole history
        fresh = SuffixAutomaton(max_len=max_len)
        fresh.reset(h)
        assert (fresh.sam.next, fresh.sam.link, fresh.sam.first, fresh.dyn) == \
               (sam.sam.next, sam.sam.link, sam.sam.first, sam.dyn)


def brute_static(h: list[int], docs: list[list[int]], k: int) -> tuple[int, list[int]]:
    """Longest suffix of h inside one document; the text after its first corpus occurrence."""
    text = [t for d in docs for t in d + [SEP]]
    for m in range(len(h), 0, -1):
        ends = ends_of(h[len(h) - m:], text)
        if ends:
            cont = text[ends[0] + 1: ends[0] + 1 + k]
            return m, cont[: cont.index(SEP)] if SEP in cont else cont
    return 0, []


def test_static_corpus_match_and_the_longer_match_wins():
    rng = random.Random(2)
    for _ in range(200):
        docs = [random_text(rng, 15) for _ in range(rng.randrange(1, 4))]
        corpus = StaticCorpus(docs)
        h = random_text(rng, 25)
        sam = SuffixAutomaton(max_len=6, corpus=corpus)
        sam.reset(h)
        ms, cont_s = brute_static(h, docs, 6)
        md, cont_d = brute_dynamic(h, 6)
        assert sam.match_length() == (md, ms)
        cands = [(md, 1, cont_d)] + [(ms, 0, cont_s)]
        cands = [c for c in cands if c[0] >= 1 and c[2]]
        assert sam.propose(6) == ([max(cands)[2]] if cands else [])


def test_examples_and_min_match():
    sam = SuffixAutomaton(max_len=3)
    sam.reset([5, 6, 7, 8, 5, 6])
    assert sam.propose(10) == [[7, 8, 5]] and sam.match_length() == (2, 0)
    assert sam.propose(2) == [[7, 8]]
    sam = SuffixAutomaton(max_len=3, min_match=3)
    sam.reset([5, 6, 7, 8, 5, 6])
    assert sam.propose(10) == []
    corpus = StaticCorpus([[1, 5, 6, 9, 9], [4]])
    sam = SuffixAutomaton(max_len=5, corpus=corpus)
    sam.reset([0, 1, 5, 6])             # static: "1 5 6" (3) beats no dynamic match
    assert sam.propose(10) == [[9, 9]]  # cut at the document's end
    with pytest.raises(ValueError):
        SuffixAutomaton(max_len=0)
