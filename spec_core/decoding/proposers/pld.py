"""Prompt Lookup Decoding (Saxena 2023): copy what followed an earlier occurrence of the history's
last n-gram. MMSpec (Table 6) runs it with ngram=4, n_pred=10.

The longest n in ngram..1 whose last-n-token n-gram occurs earlier in the history (ending before
its last position) wins; among its earlier occurrences we take the MOST RECENT. Saxena's reference
takes the first one scanning from the start of the text that still has n_pred tokens after it.
Most recent is chosen because the nearest repetition is the one the generation is most likely
continuing (a list, a loop, a phrase just quoted), and because it is O(1) to find: a dict maps
each n-gram to the end of its latest earlier occurrence, updated in O(ngram) per committed token.

A recent occurrence may have fewer than n_pred tokens after it. The copy then runs on into its
own output (LZ77's overlapping copy): token k of the proposal is ext[p + k] where ext = history +
proposal and p is where the occurrence's continuation starts - i.e. it assumes the repetition of
period len(history) - p goes on. Proposals therefore always have min(n_pred, budget) tokens.
"""

from __future__ import annotations


class PromptLookup:
    """PLD over one sample's history; one path of up to n_pred tokens."""

    def __init__(self, ngram: int = 4, n_pred: int = 10):
        if ngram < 1 or n_pred < 1:
            raise ValueError("ngram and n_pred must be >= 1")
        self.ngram, self.n_pred = ngram, n_pred
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self.ids: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}   # n-gram -> start of the continuation after its latest earlier occurrence
        self.extend(prompt_ids)

    def extend(self, new_ids: list[int]) -> None:
        ids = self.ids
        for t in new_ids:
            L = len(ids)
            # the n-grams ending at the current last token become "earlier" once t follows them
            for n in range(1, min(self.ngram, L) + 1):
                self._next[tuple(ids[L - n:])] = L
            ids.append(int(t))

    def match(self) -> tuple[int, int]:
        """(n, p): the longest matched n-gram and where its continuation starts; (0, -1) if none."""
        L = len(self.ids)
        for n in range(min(self.ngram, L - 1), 0, -1):
            p = self._next.get(tuple(self.ids[L - n:]))
            if p is not None:
                return n, p
        return 0, -1

    def propose(self, budget: int) -> list[list[int]]:
        n, p = self.match()
        k = min(self.n_pred, budget)
        if n == 0 or k <= 0:
            return []
        ids, L = self.ids, len(self.ids)
        out: list[int] = []
        for j in range(k):   # overlapping copy: past the history's end, read our own output
            src = p + j
            out.append(ids[src] if src < L else out[src - L])
        return [out]
