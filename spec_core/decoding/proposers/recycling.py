"""Token Recycling (Luo et al., ACL 2025): the target's top-k next tokens at every verified
position, "recycled" into an adjacency matrix, drafted from by expanding a static tree.

adj_VK[v] holds the k most likely next tokens after token v, best first, as the target last
predicted them at a position holding v; `update` overwrites the rows of every verified token. The
matrix starts at -1 (row unknown) and a node whose token's row is unknown gets no children, so an
unseen token drafts nothing rather than guesses. The matrix outlives `reset` (Token Recycling keeps
it across requests) and may be shared by several proposers (pass the same `adj_VK`).

Template: child j of a node carries the j-th candidate of its parent token's row. The default
is the static 80-node tree (depth 6, up to 8 children) shipped with the Token Recycling baseline
of SAM-Decoding (samd/config/token_recycle.json), written as children counts per node in BFS
order. Within `budget` we keep the template's first `budget` nodes in that BFS order (a prefix of
a BFS numbering is ancestor-closed; it drops the deepest, lowest-rank nodes first). MMSpec's
draft_len=10 would bound the depth; this template is 6 deep, so it never binds.

Slots sharing one matrix and template draft together (`batch_tree`): every slot's template
expanded at once, level by level, as one gather per level for the whole batch (measured on one
core: 15 ms per step at batch 16 with the 80-node template slot by slot, most of an AR step of the
`small` world).

Shapes: V vocabulary, K candidates per token (matrix_top_k = 8), T verified positions, B slots,
n template nodes (n1 = n + 1 with the root).
"""

from __future__ import annotations

import torch

from spec_core.decoding.tree import DraftTree, ancestor_mask

RECYCLING_TEMPLATE = (
    8,                                                                   # root -> nodes 1..8
    8, 4, 3, 2, 1, 1, 1, 1,                                              # depth 1 -> 9..29
    8, 3, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0,       # depth 2 -> 30..54
    5, 2, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0,  # depth 3 -> 55..69
    3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0,                         # depth 4 -> 70..77
    2, 0, 0, 1, 0, 0, 0, 0,                                              # depth 5 -> 78..80
    0, 0, 0,                                                             # depth 6
)

_PLANS: dict[tuple, list] = {}  # TokenRecycling._level_plan's and _template_prefix's cache


def template_nodes(children: tuple[int, ...] | list[int]) -> tuple[list[int], list[int], list[int]]:
    """BFS children counts (node 0 = root first) -> (parent, rank, depth) of nodes 1..n."""
    parent, rank, depth = [], [], []
    node_depth = [0]
    for v, c in enumerate(children):
        if v > len(parent):
            raise ValueError(f"template node {v} has no parent (counts must describe one BFS tree)")
        for j in range(c):
            parent.append(v)
            rank.append(j)
            depth.append(node_depth[v] + 1)
            node_depth.append(node_depth[v] + 1)
    if len(children) != len(parent) + 1:
        raise ValueError("template needs one children count per node")
    return parent, rank, depth


class TokenRecycling:
    """Token Recycling's adjacency matrix and static-tree drafts for one sample."""

    def __init__(self, vocab_size: int, k: int = 8, template=RECYCLING_TEMPLATE,
                 adj_VK: torch.Tensor | None = None):
        if not 1 <= k <= vocab_size:
            raise ValueError("need 1 <= k <= vocab_size")
        self.k = k
        self.template = tuple(template)
        self.parent, self.rank, self.depth = template_nodes(template)
        if self.rank and max(self.rank) >= k:
            raise ValueError(f"template has a node with more than k={k} children")
        self.adj_VK = adj_VK if adj_VK is not None else torch.full((vocab_size, k), -1, dtype=torch.long)
        if tuple(self.adj_VK.shape) != (vocab_size, k):
            raise ValueError("adj_VK must be (vocab_size, k)")
        n = len(self.parent)
        self._parent_n1 = torch.tensor([0] + self.parent)  # node 0 = the root (its own parent)
        self._rank_n1 = torch.tensor([0] + self.rank)
        self._depth_n = torch.tensor(self.depth, dtype=torch.long)
        # template nodes (1..n) per depth, and their lineage (root excluded) for building paths
        self._levels = [torch.tensor([i + 1 for i in range(n) if self.depth[i] == d])
                        for d in range(1, max(self.depth, default=0) + 1)]
        self._lineage = [[]]
        for i in range(n):
            self._lineage.append(self._lineage[self.parent[i]] + [i + 1])
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for i in range(n):
            kids[self.parent[i]].append(i + 1)   # BFS order = rank order among siblings
        self._dfs: list[int] = []                 # preorder, best rank first
        stack = kids[0][::-1]
        while stack:
            v = stack.pop()
            self._dfs.append(v)
            stack.extend(kids[v][::-1])
        self.last_token = -1

    def reset(self, prompt_ids: list[int]) -> None:
        self.last_token = int(prompt_ids[-1]) if prompt_ids else -1

    def extend(self, new_ids: list[int]) -> None:
        if new_ids:
            self.last_token = int(new_ids[-1])

    @torch.no_grad()
    def update(self, tokens_T: torch.Tensor, logits_TV: torch.Tensor) -> None:
        """adj[tokens[t]] <- top-k of logits[t], for t in order (a repeated token keeps its last).
        Pass real verified positions only (not a padded tree's pad nodes)."""
        tokens_T = torch.as_tensor(tokens_T, dtype=torch.long, device=logits_TV.device).reshape(-1)
        if tokens_T.numel() == 0:
            return
        self.learn(tokens_T, logits_TV.topk(self.k, dim=-1).indices)

    def learn(self, tokens_T: torch.Tensor | int, top_TK: torch.Tensor) -> None:
        """adj[tokens[t]] <- top_TK[t] (the target's top-k ids after tokens[t]), the last of a
        repeated token winning; one token (an AR step) is one row write."""
        if isinstance(tokens_T, int):
            self.adj_VK[tokens_T] = top_TK.reshape(-1).to(self.adj_VK.device)
            return
        uniq_U, inv_T = tokens_T.unique(return_inverse=True)
        pos_T = torch.arange(tokens_T.numel(), device=tokens_T.device)
        last_U = torch.full_like(uniq_U, -1).scatter_reduce(0, inv_T, pos_T, reduce="amax")  # last position of each token
        self.adj_VK[uniq_U.to(self.adj_VK.device)] = top_TK[last_U].to(self.adj_VK.device)

    def learn_rows(self, tokens: list[int], top_TK: torch.Tensor) -> None:
        """`learn` for host token ids (the engine's verified positions, read from its host
        transfer): the repeats resolved on the host (the last wins), one row write."""
        last = {t: i for i, t in enumerate(tokens)}
        rows = top_TK if len(last) == len(tokens) else top_TK[list(last.values())]
        self.adj_VK[torch.tensor(list(last), device=self.adj_VK.device)] = rows.to(self.adj_VK.device)

    @torch.no_grad()
    def expand(self, root: int, budget: int) -> list[int]:
        """Tokens of the template's first `budget` nodes below `root`, level by level (BFS);
        -1 below a token whose row is unknown."""
        return self._expand_rows(torch.tensor([root], device=self.adj_VK.device), budget)[0, 1:].tolist()

    def _expand_rows(self, root_B: torch.Tensor, budget: int) -> torch.Tensor:
        """(B, n1) tokens of the template's first n = min(budget, nodes) nodes below each root
        (column 0), level by level; -1 below an unknown row or a root of -1."""
        n, adj = min(budget, len(self.parent)), self.adj_VK
        tokens_Bn1 = torch.full((root_B.shape[0], n + 1), -1, dtype=torch.long, device=adj.device)
        tokens_Bn1[:, 0] = root_B
        for idx_L, parent_L, rank_L in self._level_plan(n, adj.device):
            par_BL = tokens_Bn1[:, parent_L]
            cand_BL = adj[par_BL.clamp_min(0), rank_L]
            tokens_Bn1[:, idx_L] = torch.where(par_BL >= 0, cand_BL, -1)
        return tokens_Bn1

    def _level_plan(self, n: int, device) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per template level within the first n nodes: (nodes, their parents, their ranks), cached
        per (template, n, device) for every proposer (one is made per request) - a draft's index
        tensors built once."""
        key = (self.template, n, str(device))
        if key not in _PLANS:
            plan = []
            for level in self._levels:
                idx = level[level <= n]
                if idx.numel() == 0:
                    break
                plan.append(tuple(t.to(device) for t in (idx, self._parent_n1[idx], self._rank_n1[idx])))
            _PLANS[key] = plan
        return _PLANS[key]

    def _template_prefix(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(parent (1, n), depth (1, n), ancestor mask (1, n + 1, n + 1)) of the template's first n
        nodes, cached like `_level_plan` (the tree of a draft where every token is known)."""
        key = ("prefix", self.template, n, str(device))
        if key not in _PLANS:
            parent_1n = self._parent_n1[1: n + 1][None].to(device)
            depth_1n = self._depth_n[:n][None].to(device)
            _PLANS[key] = [parent_1n, depth_1n, ancestor_mask(parent_1n, int(depth_1n.max()))]
        return tuple(_PLANS[key])

    @classmethod
    def batch_tree(cls, proposers: list, budget: int, device=None, pad_token: int = 0) -> DraftTree | None:
        """Every slot's `propose_tree(budget)` as one padded `DraftTree` (what `trees_to_batch`
        makes of them), drafted for all slots at once; None where the proposers are not all Token
        Recycling over one matrix and template (then they draft slot by slot). A node is kept iff
        its token is known (a child of an unknown node is unknown), numbered in template order."""
        live = [p for p in proposers if p is not None]
        if not live or not all(type(p) is cls and p.adj_VK is live[0].adj_VK and p.template == live[0].template
                               for p in live):
            return None
        first, dev = live[0], live[0].adj_VK.device
        root_B = torch.tensor([p.last_token if p is not None and budget > 0 else -1 for p in proposers], device=dev)
        tokens_Bn = first._expand_rows(root_B, max(budget, 0))[:, 1:]
        B, n = tokens_Bn.shape
        known_Bn = tokens_Bn >= 0
        if n and bool(known_Bn.all()):  # a warm matrix: every row is the template's first n nodes
            parent_n, depth_n, anc_n1n1 = first._template_prefix(n, dev)
            return DraftTree(tokens_Bn.to(device), parent_n.expand(B, n).to(device),
                             depth_n.expand(B, n).to(device), anc_n1n1.expand(B, n + 1, n + 1).to(device))
        new_Bn = known_Bn.cumsum(1)  # a kept node's number in its row's draft (1-based)
        N = int(new_Bn[:, -1].max()) if n else 0
        tokens_BN = torch.full((B, N), pad_token, dtype=torch.long, device=dev)
        parent_BN = torch.arange(1, N + 1, device=dev).repeat(B, 1)  # pads: their own parent
        depth_BN = torch.ones(B, N, dtype=torch.long, device=dev)
        if N:
            b_K, i_K = known_Bn.nonzero(as_tuple=True)
            at_K = new_Bn[b_K, i_K] - 1
            par_K = first._parent_n1[1:].to(dev)[i_K]  # template parent (0: the root)
            tokens_BN[b_K, at_K] = tokens_Bn[b_K, i_K]
            parent_BN[b_K, at_K] = torch.where(par_K > 0, new_Bn[b_K, (par_K - 1).clamp_min(0)], 0)
            depth_BN[b_K, at_K] = first._depth_n.to(dev)[i_K]
        max_depth = max(first.depth[:n], default=0) if N else 0  # passes past the deepest kept node change nothing
        return DraftTree(tokens_BN.to(device), parent_BN.to(device), depth_BN.to(device),
                         ancestor_mask(parent_BN, max_depth).to(device))

    def propose_tree(self, budget: int) -> tuple[list[int], list[int], list[int]]:
        """The draft as a tree in the template's own (breadth-first) order: (tokens, parent,
        depth) of its known nodes, parent 0 the root. Its first n nodes are the draft of budget n
        (`propose(n)`'s nodes), so a policy that keeps a prefix keeps a template tree of that size;
        merged from `propose`'s paths the order would be depth-first, and a prefix a chain."""
        if self.last_token < 0 or budget <= 0:
            return [], [], []
        tokens = self.expand(self.last_token, budget)
        kept = [0] * (len(tokens) + 1)  # template node -> its number in the draft (0: the root / dropped)
        out_t, out_p, out_d = [], [], []
        for i, t in enumerate(tokens, start=1):
            par = self.parent[i - 1]
            if t < 0 or (par and not kept[par]):  # unknown, or below an unknown node
                continue
            out_t.append(t)
            out_p.append(kept[par])
            out_d.append(self.depth[i - 1])
            kept[i] = len(out_t)
        return out_t, out_p, out_d

    def propose(self, budget: int) -> list[list[int]]:
        if self.last_token < 0 or budget <= 0:
            return []
        tokens = self.expand(self.last_token, budget)
        n = len(tokens)
        known = [True] + [t >= 0 for t in tokens]
        has_child = [False] * (n + 1)
        for i in range(1, n + 1):
            has_child[self.parent[i - 1]] |= known[i]
        # root-to-leaf paths in depth-first rank order (best first)
        return [[tokens[j - 1] for j in self._lineage[i]]
                for i in self._dfs if i <= n and known[i] and not has_child[i]]
