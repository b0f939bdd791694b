"""`window: auto`: the Jacobi window L, chosen for committed tokens per second on the running
hardware rather than per forward.

An iteration that forwards [last committed, L - 1 drafts] over G rows costs t(G L) seconds and
commits k tokens (the leading accepted drafts plus one), so the window to run is

    L* = argmax_L E[k | L] / t(G L)

with t(G L) the median measured seconds of an iteration at L over its last `RECENT` iterations
(carried to another row count G by the goodput engine's `CostModel`, t(T) = a + b T fitted on every
iteration: a line fitted over 1..max_window tokens misjudges the ratio of two windows by as much as
their difference in rate, a measured time does not; a median, not a mean, because a few iterations
stalled by a neighbour - another actor's prefill on a shared CPU - would otherwise decide), and
E[k | L] the mean committed tokens per iteration of the requests run at L. L is chosen per request
(per `begin`, one decoder run: the batch's requests from their first iteration to their last),
among the candidates max_window, max/2, ..., 1.

Why per request and not per iteration: under coupling the drafts converge over the iterations that
re-draft them, so what an iteration at L commits depends on the windows that came before it. A
window of 16 leaves the drafts past 16 stale (per-position acceptance measured under it says the
positions past 16 are worthless - a trap), and a long window run for a few iterations after a short
one commits less than it does when it runs throughout. Measured over whole requests, E[k | L] is
what a request at L really commits, the quantity the latency of a fixed window is made of.

The first requests try every candidate, largest first, that could still win; then every
`reexplore`-th request tries a neighbour of the best (half or double), so the estimates follow the
workload. On a GPU, where a longer forward costs about as much as a short one, the largest window
wins; on a CPU, where a 64-token forward costs several one-token ones, the one where extra rows stop
paying for themselves.

Which candidates could still win: from the same state, a window c commits exactly min(k, c) where a
longer one committed k (its first c - 1 drafts are the same drafts, verified by the same draws), and
over later iterations no more than that (its drafts past c are never refreshed). So the commits per
iteration observed at an explored longer window bound a shorter one: E[min(k, c)] over its observed
histogram of k. A candidate whose bound per second loses to the best measured rate is never run;
before two windows have been timed the slope of t is unknown and every candidate is worth a try.
`exploring` says whether some candidate still is.

Requests differ far more than windows do (on the small generator one image commits 6 tokens per
iteration at L = 64 and another 3.7), so windows compared on different requests are compared on
their requests' luck, and a chooser that keeps updating the estimate of the window it runs while
the others stay frozen chases that luck. A worker therefore calibrates paired (`calibrate`): at
actor start, untimed, the candidates that could win race on the same prompts and seeds
(`next_window = L` before each), leaving the race as the per-prompt time ratios tell them apart
(Student's t: a close pair needs more prompts than a clear one), and the fastest is `lock`ed for
its timed requests (as the goodput engine calibrates its cost model at start); a chooser never
locked keeps exploring and re-exploring. A locked request runs exactly as the fixed window does.

Losslessness does not depend on the choice: the decoder keeps J = max_window - 1 drafts with the
distributions they were drawn from, and a window only decides which of them are verified now.
"""

from __future__ import annotations

import statistics
from collections import deque

import torch

from spec_core.decoding.goodput import CostModel

RECENT = 256  # iterations per window whose median time is its cost


class WindowChooser:
    """L per request in [1, max_window] maximising expected committed tokens per second.

    Lives as long as its decoder or worker (across requests): the cost fit and the commit
    estimates carry over, so exploration is paid once. `chosen` lists the L of every iteration."""

    def __init__(self, max_window: int, reexplore: int = 16, decay: float = 0.9):
        if max_window < 1:
            raise ValueError(f"max_window must be >= 1, got {max_window}")
        self.max_window, self.reexplore, self.decay = max_window, reexplore, decay
        self.cost = CostModel()
        L, cands = max_window, []
        while L > 1:
            cands.append(L)
            L //= 2
        self.candidates = cands + [1]  # largest first: the exploration order
        # per candidate: committed tokens and sample-iterations, and the histogram of commits per
        # sample-iteration (k = 0..c), decayed once per request run at it
        self.commits = {c: 0.0 for c in self.candidates}
        self.iters = {c: 0.0 for c in self.candidates}
        self.hist_K = {c: torch.zeros(c + 1, dtype=torch.float64) for c in self.candidates}
        # per candidate: (seconds, tokens forwarded) of its last RECENT iterations
        self.timed: dict[int, deque[tuple[float, int]]] = {c: deque(maxlen=RECENT) for c in self.candidates}
        self.chosen: list[int] = []
        self.requests = 0
        self.current = self.candidates[0]
        self.locked: int | None = None  # the window of every request after `lock`
        self.next_window: int | None = None  # the next request's window, set by a calibration

    def expected_commits(self) -> dict[int, float]:
        """E[k | L] per explored candidate, made non-decreasing in L: from the same state a longer
        window commits at least as much (its first rows are the shorter one's), so a dip is noise
        of the requests each estimate happened to see."""
        out, top = {}, 0.0
        for c in reversed(self.candidates):  # increasing L
            if self.iters[c] > 0:
                top = max(top, self.commits[c] / self.iters[c])
                out[c] = top
        return out

    def iteration_s(self, c: int, rows: int) -> float:
        """Seconds of an iteration at window c over `rows` rows: the median of its recent measured
        iterations, each carried by the cost line from the tokens it forwarded to rows c (the line
        alone before any)."""
        if not self.timed[c]:
            return self.cost.verify_s(rows * c)
        to = self.cost.verify_s(rows * c)
        scaled = [s * to / at if (at := self.cost.verify_s(T)) > 0 and to > 0 else s for s, T in self.timed[c]]
        return statistics.median(scaled)

    def rates_per_second(self, rows: int) -> dict[int, float]:
        """Expected committed tokens per second (per sample) of every explored candidate."""
        return {c: e / max(self.iteration_s(c, rows), 1e-12) for c, e in self.expected_commits().items()}

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
        the best measured rate (all of them while the cost of a longer forward is unknown)."""
        rates = self.rates_per_second(rows)
        top = max(rates.values()) if rates else 0.0
        sloped = len(rates) >= 2  # two windows timed (a request's capped tail says little of the slope)
        out = []
        for c in self.candidates:
            if self.iters[c] > 0:
                continue
            bound = self.commit_bound(c)
            if bound is None or not sloped or bound / max(self.cost.verify_s(rows * c), 1e-12) >= top:
                out.append(c)
        return out

    def exploring(self, rows: int) -> bool:
        """Whether some candidate still deserves its first request."""
        return bool(self.worth_trying(rows))

    def lock(self, rows: int, window: int | None = None) -> int:
        """From now on every request runs at `window` (default: the best for `rows` rows), after
        a paired calibration (`calibrate`)."""
        if window is not None and window not in self.candidates:
            raise ValueError(f"window {window} is not a candidate {self.candidates}")
        self.locked = self.best(rows) if window is None else window
        return self.locked

    def begin(self, rows: int) -> int:
        """A request (a batch of `rows` rows) starts: its window, kept until it ends
        (`next_window` when a calibration set it)."""
        best, unexplored = self.best(rows), self.worth_trying(rows)
        self.requests += 1
        window, self.next_window = self.next_window, None
        if window is not None:
            if window not in self.candidates:
                raise ValueError(f"window {window} is not a candidate {self.candidates}")
            L = window
        elif self.locked is not None:
            L = self.locked
        elif unexplored:
            L = unexplored[0]
        elif self.requests % self.reexplore == 0:  # a neighbour of the best, alternately below / above
            i = self.candidates.index(best)
            side = (self.requests // self.reexplore) % 2
            L = self.candidates[min(i + 1, len(self.candidates) - 1) if side else max(i - 1, 0)]
        else:
            L = best
        self.current = L
        self.commits[L] *= self.decay
        self.iters[L] *= self.decay
        self.hist_K[L] *= self.decay
        return L

    def choose(self, rows: int, cap: int | None = None) -> int:
        """This iteration's L: the request's, at most `cap` (the rows still useful)."""
        L = self.current if cap is None else max(1, min(self.current, cap))
        self.chosen.append(L)
        return L

    def observe(self, L: int, rows: int, seconds: float, leading_B: torch.Tensor,
                left_B: torch.Tensor | None = None) -> None:
        """An iteration of window L took `seconds`; sample b accepted its first leading_B[b] drafts
        and so committed min(leading + 1, left_B[b]) tokens (left: tokens it still needed).
        Locked, there is nothing left to learn: nothing is recorded (a locked request costs what
        the fixed window does)."""
        if self.locked is not None:
            return
        self.cost.observe(rows * L, seconds)
        if L != self.current:  # a capped iteration at the end of a request says little about L
            return
        k_B = leading_B.to(torch.long).cpu() + 1
        if left_B is not None:
            k_B = torch.minimum(k_B, left_B.to(torch.long).cpu())
        self.commits[L] += float(k_B.sum())
        self.iters[L] += len(k_B)
        self.hist_K[L] += torch.bincount(k_B.clamp(1, L), minlength=L + 1).to(torch.float64)
        self.timed[L].append((seconds, rows * L))

    def stats(self) -> dict:
        """What reports show: iterations, mean L, the cost fit, E[k | L] per candidate."""
        a, b = self.cost.coefficients()
        return {"iterations": len(self.chosen),
                "mean_window": sum(self.chosen) / len(self.chosen) if self.chosen else None,
                "ms_intercept": 1e3 * a, "ms_per_token": 1e3 * b,
                "commits_per_iteration": {c: round(e, 2) for c, e in self.expected_commits().items()}}


# Student's t, two-sided 95%, by degrees of freedom (the per-prompt ratios are few: with 3 of them
# a normal quantile would call a difference of 2 noisy prompts out of 3 clear)
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with df degrees of freedom (the next smaller
    tabulated df: conservative), 1.96 past 30."""
    return 1.96 if df > 30 else _T95[max(d for d in _T95 if d <= max(df, 1))]


def calibrate(chooser: WindowChooser, rows: int, run, prompts: int, margin: float = 0.02,
              first_cut: int = 3) -> tuple[int, dict[int, list[float]]]:
    """Paired calibration of a worker's chooser, then `lock`: `run(L, p)` decodes calibration
    prompt p (its own prompt and seed, the same for every L) at window L and returns its seconds.

    Prompt 0 runs every candidate that could still win (largest first, pruned by the commit bound
    as the chooser learns). Then the survivors race on prompts 1, 2, ...: from `first_cut` prompts
    on, a window leaves the race when the mean of its per-prompt log time ratio to the fastest
    total, m +- t se (Student's t at 95%), says it is slower (m - t se > 0) or at most `margin`
    slower (m + t se < margin: the same to within what the choice could cost); the race ends with
    one window left or
    after `prompts` prompts, and the fastest total is locked. Requests differ more than windows do
    (one prompt needs 40% more forwards at the same window), so only the same prompts compare two
    windows, and a close pair needs more of them than a clear one. Returns the window and the
    seconds per prompt of each window raced."""
    times: dict[int, list[float]] = {}
    while True:  # prompt 0: whatever could still win, the chooser learning as it goes
        worth = chooser.worth_trying(rows)
        if not worth or worth[0] in times:
            break
        chooser.next_window = worth[0]
        times[worth[0]] = [run(worth[0], 0)]
    if not times:  # nothing left to try (a chooser that already knows): its best
        return chooser.lock(rows), times
    alive = sorted(times, reverse=True)
    for p in range(1, prompts):
        if len(alive) == 1:
            break
        for L in alive:
            chooser.next_window = L
            times[L].append(run(L, p))
        if p + 1 < first_cut:
            continue
        fast = min(alive, key=lambda L: sum(times[L]))
        for L in [c for c in alive if c != fast]:
            r = torch.tensor(times[L]).log() - torch.tensor(times[fast]).log()
            m, half = float(r.mean()), t95(len(r) - 1) * float(r.std() / len(r) ** 0.5)
            if m - half > 0 or m + half < margin:
                alive.remove(L)
    best = min(alive, key=lambda L: sum(times[L]))
    return chooser.lock(rows, best), times
