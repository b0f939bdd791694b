"""Lookahead (Zhao et al., KDD 2024): a trie of the n-grams of the prompt and generated text with
their frequencies; the draft is a tree of the most frequent continuations of the history's last
tokens. MMSpec (Table 6) runs it with decoding_length=64 (nodes per tree), branch_length=12.

The trie holds every n-gram of the history with n <= W = max_match + branch_length, each node
counting the n-gram's occurrences (Lookahead's `put` stores, per token, the branch_length + 1
tokens after it; with its default 2-token query that is the same W). Each committed token extends
the W windows that end at it by one node: O(W) per token, and the nodes of the history's
suffixes are at hand, so matching is a lookup.

Retrieval: the longest suffix of the history of length <= max_match (Lookahead queries the last
2 tokens) whose trie node has children - i.e. it also occurs earlier, followed by a token. Below
it, Lookahead's `_ravel`: depth-first, children by descending frequency (ties: the more recent
occurrence first), at most branch_length deep, stopping after min(decoding_length, budget) nodes.
The result is returned as its root-to-leaf paths in that order, so `paths_to_tree` rebuilds it.

Not reproduced: Lookahead's fallback to a shorter query when the longer one yields fewer than
branch_length tokens, its stop words, and its memory of earlier requests' outputs (a proposer
here sees one sample; `reset` clears the trie).
"""

from __future__ import annotations


class LookaheadTrie:
    """Lookahead's n-gram trie over one sample's history."""

    def __init__(self, decoding_length: int = 64, branch_length: int = 12, max_match: int = 2):
        if min(decoding_length, branch_length, max_match) < 1:
            raise ValueError("decoding_length, branch_length and max_match must be >= 1")
        self.decoding_length, self.branch_length, self.max_match = decoding_length, branch_length, max_match
        self.window = max_match + branch_length
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self.ids: list[int] = []
        self.children: list[dict[int, int]] = [{}]   # node 0: the empty n-gram
        self.count: list[int] = [0]                  # occurrences of the node's n-gram
        self.last: list[int] = [-1]                  # end index of its latest occurrence
        self.suffix: list[int] = []                  # suffix[m - 1]: node of the last m tokens, m <= W
        self.extend(prompt_ids)

    def extend(self, new_ids: list[int]) -> None:
        for t in new_ids:
            t, pos = int(t), len(self.ids)
            self.ids.append(t)
            new = []
            for node in [0] + self.suffix[: self.window - 1]:   # every window ending here grows by t
                child = self.children[node].get(t)
                if child is None:
                    child = len(self.count)
                    self.children[node][t] = child
                    self.children.append({})
                    self.count.append(0)
                    self.last.append(-1)
                self.count[child] += 1
                self.last[child] = pos
                new.append(child)
            self.suffix = new

    def match(self) -> tuple[int, int]:
        """(m, node): the longest matched suffix length (<= max_match) and its trie node; (0, 0)."""
        for m in range(min(self.max_match, len(self.suffix)), 0, -1):
            node = self.suffix[m - 1]
            if self.children[node]:
                return m, node
        return 0, 0

    def propose(self, budget: int) -> list[list[int]]:
        m, node = self.match()
        left = min(self.decoding_length, budget)
        if m == 0 or left <= 0:
            return []
        paths: list[list[int]] = []

        def dfs(v: int, prefix: list[int]) -> None:
            nonlocal left
            taken = False
            if len(prefix) < self.branch_length:
                kids = sorted(self.children[v].items(), key=lambda kv: (-self.count[kv[1]], -self.last[kv[1]]))
                for tok, c in kids:
                    if left == 0:
                        break
                    left -= 1
                    taken = True
                    dfs(c, prefix + [tok])
            if not taken and prefix:
                paths.append(prefix)

        dfs(node, [])
        return paths
