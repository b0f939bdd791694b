"""SAM-Decoding (Hu et al., ACL 2025): the longest suffix of the history that occurred before, found
with suffix automata, and the text that followed it as one draft chain.

Two automata, as in SAM-Decoding:
- dynamic: built online over this sample's history (`extend` adds each token in O(1) amortised).
  Before a token is added, the match state steps over it in the automaton of the text so far, so
  the match is the longest suffix of the history that also ends at an EARLIER position (never
  the trivial self-match); a state's `first` (the end of its first occurrence) is then <= L - 2
  and at least one token follows it.
- static: built once over a fixed corpus (documents joined by a -1 separator that no token
  matches); per sample only a match state walks it.
The longer match wins, the dynamic one on ties (SAM-Decoding's rule with len_bias = 0). The draft
is the text after the match's FIRST occurrence (the end position a suffix automaton keeps for free;
SAM-Decoding's `min_endpos`), up to min(max_len, budget) tokens, cut at the history's / document's end.

MMSpec's SAM settings (total_token=30, depth=3, top_k=8) size the auxiliary draft tree SAM-Decoding
falls back to when the match is short; that tree is another proposer's job. Here the chain is
max_len = 10 tokens (SAM-Decoding's n_predicts default), and `match_length` lets a caller apply
SAM-Decoding's threshold and fall back.
"""

from __future__ import annotations

SEP = -1   # document separator in a static corpus


class Automaton:
    """A suffix automaton over a growing token text: states with transitions, suffix link, longest
    length and the end index of their first occurrence."""

    def __init__(self):
        self.text: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first: list[int] = [-1]
        self.last = 0

    def add(self, t: int) -> None:
        """Append token t (the classic online construction, amortised O(1))."""
        pos = len(self.text)
        self.text.append(t)
        cur = self._state(self.length[self.last] + 1, pos, {})
        p = self.last
        while p != -1 and t not in self.next[p]:
            self.next[p][t] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][t]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:   # split q: the clone keeps q's transitions and first occurrence
                clone = self._state(self.length[p] + 1, self.first[q], dict(self.next[q]))
                self.link[clone] = self.link[q]
                while p != -1 and self.next[p].get(t) == q:
                    self.next[p][t] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def _state(self, length: int, first: int, nxt: dict[int, int]) -> int:
        self.next.append(nxt)
        self.link.append(-1)
        self.length.append(length)
        self.first.append(first)
        return len(self.length) - 1

    def step(self, state: int, length: int, t: int) -> tuple[int, int]:
        """Matching statistics: (state, length) of the longest suffix of (matched text + t) that is
        a substring of the text."""
        while state and t not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        nxt = self.next[state].get(t)
        return (nxt, length + 1) if nxt is not None else (0, 0)

    def canonical(self, state: int, length: int) -> int:
        """The state whose class holds the matched string of this length (after a split the match
        may sit in the clone, one suffix link up)."""
        while state and self.length[self.link[state]] >= length:
            state = self.link[state]
        return state

    def continuation(self, state: int, k: int) -> list[int]:
        """Up to k tokens after the first occurrence of `state`'s strings, cut at a separator."""
        if state == 0 or k <= 0:
            return []
        e = self.first[state]
        out = self.text[e + 1: e + 1 + k]
        return out[: out.index(SEP)] if SEP in out else out


class StaticCorpus:
    """The static automaton over a fixed corpus of token documents (shared by all samples)."""

    def __init__(self, documents: list[list[int]]):
        self.sam = Automaton()
        for doc in documents:
            for t in doc:
                self.sam.add(int(t))
            self.sam.add(SEP)


class SuffixAutomaton:
    """SAM-Decoding's drafter over one sample: dynamic automaton + optional static corpus."""

    def __init__(self, max_len: int = 10, corpus: StaticCorpus | None = None, min_match: int = 1):
        if max_len < 1 or min_match < 1:
            raise ValueError("max_len and min_match must be >= 1")
        self.max_len, self.corpus, self.min_match = max_len, corpus, min_match
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self.sam = Automaton()
        self.dyn = (0, 0)      # (state, length) of the match in the dynamic automaton
        self.static = (0, 0)   # ... in the static one
        self.extend(prompt_ids)

    def extend(self, new_ids: list[int]) -> None:
        sam = self.sam
        for t in new_ids:
            t = int(t)
            s, n = sam.step(*self.dyn, t)    # match against the text BEFORE t: an earlier occurrence
            sam.add(t)
            self.dyn = (sam.canonical(s, n), n)
            if self.corpus is not None:
                self.static = self.corpus.sam.step(*self.static, t)

    @property
    def history(self) -> list[int]:
        return self.sam.text

    def match_length(self) -> tuple[int, int]:
        """(dynamic, static) match lengths."""
        return self.dyn[1], self.static[1]

    def propose(self, budget: int) -> list[list[int]]:
        k = min(self.max_len, budget)
        cands = [(self.dyn[1], 1, self.sam.continuation(self.dyn[0], k))]
        if self.corpus is not None:
            cands.append((self.static[1], 0, self.corpus.sam.continuation(self.static[0], k)))
        cands = [c for c in cands if c[0] >= self.min_match and c[2]]
        return [max(cands)[2]] if cands else []   # longer match first; the dynamic one on ties
