"""`window: auto`: the Jacobi window L, chosen for committed tokens per second on the running
hardware rather than per forward.

An iteration that forwards [last committed, L - 1 drafts] over G rows costs t(G L) seconds and
commits k tokens (the leading accepted drafts plus one), so the window to run is

    L* = argmax_L E[k | L] / t(G L)

with t the goodput engine's `CostModel` (t(T) = a + b T, least squares with forgetting) fitted on the
measured seconds of every iteration, and E[k | L] the mean committed tokens per iteration observed
while running at L. E[k | L] is measured, not predicted from per-draft acceptance: under coupling
the drafts converge over the iterations that re-draft them, so what a draft position is worth
depends on the windows that came before it (a window of 16 leaves the drafts past 16 stale, and
per-position acceptance measured under it says positions past 16 are worthless - a trap).

L is chosen per segment of `segment` iterations among the candidates max_window, max/2, max/4,
..., 1 (one L for the whole batch: a batch forward is dense anyway); after a change of L the first
third of the segment, still on drafts the old window left, is not counted. The first segments try every
candidate, largest first, that could still win; then
every `reexplore`-th segment tries a neighbour of the best (half or double), so the estimates
follow the running request. On a GPU, where a longer forward costs about
as much as a short one, the largest window wins; on a CPU, where a 64-token forward costs several
one-token ones, the one where extra rows stop paying for themselves.

Which candidates could still win: from the same state, a window c commits exactly min(k, c) where
a longer one committed k (its first c - 1 drafts are the same drafts, verified by the same draws),
and over later iterations no more than that (the drafts past c are not refreshed). So the commits
per iteration observed at the longest explored window bound every shorter one: E[min(k, c)] over
its observed histogram of k. A candidate whose bound per second loses to the best measured rate is
never run. `exploring` says whether some candidate is still worth a first segment: a worker runs
its untimed warm-up until it is not, so that the exploration is paid once per actor, not by the
timed requests (as the goodput engine calibrates its cost model at start).

The choice only changes which drafts are verified now: the decoder keeps the others (with the
distribution they were drawn from) for later, so the output is distributed exactly as before.
"""

from __future__ import annotations

import torch

from spec_core.decoding.goodput import CostModel


class WindowChooser:
    """L per iteration in [1, max_window] maximising expected committed tokens per second.

    Lives as long as its decoder (across requests): the cost fit and the commit estimates carry
    over, so exploration is paid once. `chosen` lists the L of every iteration."""

    def __init__(self, max_window: int, segment: int = 24, reexplore: int = 8, decay: float = 0.9):
        if max_window < 1:
            raise ValueError(f"max_window must be >= 1, got {max_window}")
        self.max_window, self.segment, self.reexplore, self.decay = max_window, segment, reexplore, decay
        self.cost = CostModel()
        L, cands = max_window, []
        while L > 1:
            cands.append(L)
            L //= 2
        self.candidates = cands + [1]  # largest first: the exploration order
        # per candidate: committed tokens and sample-iterations, and the histogram of commits per
        # sample-iteration (k = 1..c), decayed once per segment run at it
        self.commits = {c: 0.0 for c in self.candidates}
        self.iters = {c: 0.0 for c in self.candidates}
        self.hist_K = {c: torch.zeros(c + 1, dtype=torch.float64) for c in self.candidates}
        self.chosen: list[int] = []
        self.segments = 0
        self.current = self.candidates[0]
        self._left = 0  # iterations left in the current segment
        self._settle = 0  # its first iterations after a change of L: not counted

    def expected_commits(self) -> dict[int, float]:
        """E[k | L] per explored candidate, made non-decreasing in L: from the same state a longer
        window commits at least as much (its first rows are the shorter one's), so a dip is noise
        of the positions and requests each estimate happened to see."""
        out, top = {}, 0.0
        for c in reversed(self.candidates):  # increasing L
            if self.iters[c] > 0:
                top = max(top, self.commits[c] / self.iters[c])
                out[c] = top
        return out

    def rates_per_second(self, rows: int) -> dict[int, float]:
        """Expected committed tokens per second (per sample) of every explored candidate."""
        return {c: e / max(self.cost.verify_s(rows * c), 1e-12) for c, e in self.expected_commits().items()}

    def best(self, rows: int) -> int:
        r = self.rates_per_second(rows)
        if not r:
            return self.candidates[0]
        top = max(r.values())
        return max(c for c in r if r[c] >= (1 - 1e-6) * top)  # ties (to round-off): the larger window

    def commit_bound(self, c: int) -> float | None:
        """At most what window c commits per sample-iteration: E[min(k, c)] over the commits k
        observed at an explored window >= c, the largest such bound (estimates are noisy: the
        chooser stays optimistic); None before any."""
        bounds = []
        for L in self.candidates:
            if L >= c and self.iters[L] > 0:
                h_K = self.hist_K[L]
                k_K = torch.arange(len(h_K), dtype=torch.float64).clamp_max(c)
                bounds.append(float((h_K * k_K).sum() / h_K.sum().clamp_min(1e-12)))
        return max(bounds) if bounds else None

    def worth_trying(self, rows: int) -> list[int]:
        """Unexplored candidates, largest first, whose commit bound per second could still beat
        the best measured rate (all of them while the cost of a longer forward is unknown: one
        window's timings say nothing of the slope)."""
        rates = self.rates_per_second(rows)
        top = max(rates.values()) if rates else 0.0
        out = []
        for c in self.candidates:
            if self.iters[c] > 0:
                continue
            bound = self.commit_bound(c)
            if bound is None or not self.cost.varied or bound / max(self.cost.verify_s(rows * c), 1e-12) >= top:
                out.append(c)
        return out

    def exploring(self, rows: int) -> bool:
        """Whether some candidate still deserves its first segment."""
        return bool(self.worth_trying(rows))

    def _next_segment(self, rows: int) -> int:
        best = self.best(rows)
        unexplored = self.worth_trying(rows)
        if unexplored:
            return unexplored[0]
        if self.segments % self.reexplore == 0:  # a neighbour of the best, alternately below / above
            i = self.candidates.index(best)
            side = (self.segments // self.reexplore) % 2
            j = min(i + 1, len(self.candidates) - 1) if side else max(i - 1, 0)
            return self.candidates[j]
        return best

    def choose(self, rows: int, cap: int | None = None) -> int:
        """This iteration's L for a forward over `rows` rows; at most `cap` (the rows still useful)."""
        if self._left == 0:
            L = self._next_segment(rows)
            # after a change of L the first iterations run on drafts the old window left stale (or,
            # growing, fresh) and not yet converged: what they commit belongs to neither window
            self._settle = self.segment // 3 if L != self.current else 0
            self.current = L
            self.segments += 1
            self._left = self.segment
            self.commits[self.current] *= self.decay
            self.iters[self.current] *= self.decay
            self.hist_K[self.current] *= self.decay
        self._left -= 1
        L = self.current if cap is None else max(1, min(self.current, cap))
        self.chosen.append(L)
        return L

    def observe(self, L: int, rows: int, seconds: float, leading_B: torch.Tensor,
                left_B: torch.Tensor | None = None) -> None:
        """An iteration of window L took `seconds`; sample b accepted its first leading_B[b] drafts
        and so committed min(leading + 1, left_B[b]) tokens (left: tokens it still needed)."""
        self.cost.observe(rows * L, seconds)
        k_B = leading_B.to(torch.long).cpu() + 1
        if left_B is not None:
            k_B = torch.minimum(k_B, left_B.to(torch.long).cpu())
        if self._settle > 0:
            self._settle -= 1
        elif L == self.current:  # a capped iteration at the end of a request says little about L
            self.commits[L] += float(k_B.sum())
            self.iters[L] += len(k_B)
            self.hist_K[L] += torch.bincount(k_B.clamp(1, L), minlength=L + 1).to(torch.float64)

    def stats(self) -> dict:
        """What reports show: iterations, mean L, the cost fit, E[k | L] per candidate."""
        a, b = self.cost.coefficients()
        return {"iterations": len(self.chosen),
                "mean_window": sum(self.chosen) / len(self.chosen) if self.chosen else None,
                "ms_intercept": 1e3 * a, "ms_per_token": 1e3 * b,
                "commits_per_iteration": {c: round(e, 2) for c, e in self.expected_commits().items()}}
