"""Goodput-driven speculation: how many draft nodes to verify per step, from what the running
hardware and the drafter's acceptance actually cost and give.

A step over B slots verifies [root, N nodes] per slot in one dense forward (B x (1 + N) tokens;
a slot with fewer real nodes is padded, so the cost follows N, not each slot's own count). Its
expected yield is, per active slot, the bonus token plus each verified node's acceptance
probability (a node is accepted iff its whole path is, and the walk commits accepted nodes + 1):

    goodput(N) = (n_active + sum_b sum_{i < N} p_bi) / (t_draft + t_verify(B * (1 + N)) + t_commit(N))

Nodes come ordered so that every prefix is ancestor-closed (a feature drafter's / Medusa's tree
by descending draft score, a proposer's in topological order), so truncating to N is a slice.
`choose_nodes` picks the N that maximises goodput (once the draft is paid, the policy passes the
planned long-run rate: N maximises tokens - rate x seconds); N = 0 is a plain AR step. Losslessness is
untouched: any tree is verified by the target's own rule; only the tree's size changes.

- `CostModel`: t_verify(T) = a + b T, a least-squares fit over measured (tokens, seconds) with
  exponential forgetting (calibrated when an engine starts, refreshed by every step), the
  drafter's seconds per depth, and what committing a verified tree costs beyond an AR step's commit
  (t_commit(N > 0) - t_commit(0): moving accepted KV, feeding the accepted tokens to a feature
  drafter, which an AR step defers) - exponential moving averages. Where the drafter costs as much
  as the target (a tiny world), that commit term is what makes AR win. And what every step pays
  whatever its plan (the AR part of committing, the engine's bookkeeping between steps; not the
  admissions' prefills, which the requests pay whatever the steps do): a step's rate counts it in
  its seconds, or a plan prefers smaller trees than the fastest run has.
- `AcceptanceModel`: p(accepted) per node, calibrated online against observed acceptance: by
  draft confidence (exp of the cumulative draft log-probability, EAGLE-2's score) in buckets for
  drafters that score their nodes, by depth for training-free proposers; a prior where nothing
  has been observed yet.

- The floor (`GoodputPolicy._may_learn`): learning steps - explorations, probes - cost time AR
  would not have spent. They run only while what they lost to AR so far is within `learn_share` of
  AR's seconds for every token committed so far, plus `learn_allowance` AR steps per engine, and
  only while some plan could beat AR at the acceptance still to be revealed (`may_pay`): a drafter
  that cannot pay settles on AR at that cost, one that pays is never held (its learning gains).

Shapes: B slots, N draft nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

_BUCKETS = 10          # confidence buckets [0, .1), ..., [.9, 1]
_PRIOR_WEIGHT = 4.0    # pseudo-observations behind each bucket's prior
_LOG_EDGES = np.log(np.arange(1, _BUCKETS) / _BUCKETS)  # a log-probability's bucket edges (the top bucket holds 0)


@dataclass
class GoodputConfig:
    """Every constant of the goodput policy, one line each on why (the measurements behind each, and
    how one is decided - a paired A/B kept only past the run-to-run spread: docs/design/goodput.md)."""

    # learning: what is drafted beyond the plan, so that the cost fit and the value curves stay true
    calibrate: int = 2              # first steps: a one-node chain, then AR, measure every cost term (a full tree: ~5 AR steps)
    explore_rows: int = 6           # slot-trees per first exploration entry (one: 0.89-0.97x the CPU tree; 6: 0.94-1.01x)
    reexplore: int = 32             # steps at least between re-explorations, which keep the fit and the curves current
    explore_share: float = 0.01     # a re-exploration's extra cost, as a share of the steps between (0.02 ran 0.7-5% slower)
    max_pause: int = 64             # steps at most between probes while AR is planned (the pause doubles up to it) ...
    probe_share: float = 0.02       # ... or as many as make one probe this share of them (every 64: -10% at batch 16)
    ar_probe_steps: int = 2         # AR steps of an AR probe, measured on the last (a first AR step runs 10-15% slower)
    ar_probe_every: int = 64        # drafting steps at least between AR probes ...
    ar_probe_share: float = 0.0025  # ... or as many as make what one loses to the plan this share (1 in 256: +2%)
    # the floor: learning never costs more than a small share of AR's time
    learn_share: float = 0.02       # learning may lose this share of AR's seconds for the tokens committed so far ...
    learn_allowance: float = 4.0    # ... plus this many AR steps per engine (so that the first requests may calibrate at all)
    optimism: float = 1.22          # a plan's value may still be V + optimism x cap / sqrt(slot-trees): Hoeffding's one-sided 95%
    settle_accepted: float = 0.5    # accepted nodes per slot-tree below which a drafter is past hope (trained drafters: ~3)
    # what learning remembers and what it costs per step
    alpha: float = 0.03             # the value curves' forgetting per step (0.1: an argmax over noise; 0.03 ran +0.6-6.4%)
    learn_every: int = 4            # an ordinary tree teaches the curves one step in this many (every tree: ~5% of a batch-2 run)
    replan_every: int = 4           # steps a drafting plan is reused (planning every step: 1.6% of a batch-2 step)


def _host(x) -> np.ndarray:
    """A tensor's values as a host array (no copy for a CPU tensor); arrays pass through. The
    policy's arithmetic is on a few hundred numbers per step: numpy's per-call cost is a fraction
    of torch's (measured: the policy's plan, choice and update cost ~0.5-0.8 ms per step in torch,
    6-9% of a batch-1 step of the `small` world on 2 cores)."""
    return x.numpy(force=True) if isinstance(x, torch.Tensor) else np.asarray(x)  # (one call: detach, cpu)


def _ema(old: float | None, new: float, alpha: float) -> float:
    """An exponential moving average's next value (the first observation taken whole)."""
    return new if old is None else (1 - alpha) * old + alpha * new


@dataclass
class LineFit:
    """seconds = a + b x, a least-squares fit over measured (x, seconds) with exponential forgetting."""

    decay: float = 0.98            # weight kept by older observations per new one
    _s: list[float] = field(default_factory=lambda: [0.0] * 5)  # sum w, wx, wx^2, wy, wxy

    def observe(self, x: float, seconds: float) -> None:
        s = self._s
        for i in range(5):
            s[i] *= self.decay
        s[0] += 1.0
        s[1] += x
        s[2] += x * x
        s[3] += seconds
        s[4] += x * seconds

    @property
    def ready(self) -> bool:
        return self._s[0] > 0

    @property
    def varied(self) -> bool:
        """Whether the observed x have varied (before, the slope b is unknown, not 0)."""
        w, t, t2 = self._s[:3]
        return w > 0 and w * t2 - t * t > 1e-9 * max(w * t2, 1.0)

    def coefficients(self) -> tuple[float, float]:
        """(a, b) with a, b >= 0, the weighted least-squares line under those bounds; a flat line
        through the mean while x has not varied.

        Where the free fit's intercept is negative (seconds convex in x over the observed range),
        the bounded fit is the line through the origin, b = sum wxy / sum wx^2. Clamping a to 0 and
        keeping the free slope instead lifted the whole line by -a above the observations (seen
        once on 2 cores at batch 16, FOVEA on the CPU tree's shape: 0.00 + 2.44 ms per token, AR
        chosen on 97% of the steps; not reproduced since, docs/results.md)."""
        w, t, t2, y, ty = self._s
        if w <= 0:
            return 0.0, 0.0
        var = w * t2 - t * t
        b = (w * ty - t * y) / var if self.varied else 0.0
        if b <= 0.0:  # no slope: the mean
            return max(y / w, 0.0), 0.0
        a = (y - b * t) / w
        if a < 0.0:  # through the origin
            return 0.0, max(ty / t2, 0.0)
        return a, b

    def at(self, x: float) -> float:
        a, b = self.coefficients()
        return a + b * x


@dataclass
class CostModel(LineFit):
    """Seconds of a verification forward over T tokens (all slots): a + b T (the LineFit), and of
    drafting: seconds per depth as a line in the rows the drafter expands (slots x width)."""

    draft_per_depth: float = 0.0   # seconds of one drafting depth (EMA over every width); 0: not measured yet
    draft_step: float = 0.0        # seconds of a whole draft (EMA over drafting steps); 0: not measured yet
    commit_tree: float = -1.0      # seconds to commit a step that verified nodes (EMA); < 0: not yet
    commit_ar: float = -1.0        # ... and an AR step
    draft_fit: LineFit = field(default_factory=LineFit)  # seconds per depth vs expanded rows
    nodes_fit: LineFit = field(default_factory=LineFit)  # a proposer's whole draft: seconds vs nodes per slot
    overhead: float = -1.0         # seconds of a step outside drafting, verifying and the commit extra (EMA); < 0: not yet
    ar: dict[int, float] = field(default_factory=dict)    # rows -> seconds of a verify without nodes (EMA)
    pad: Callable[[int], int] | None = None  # tokens per row a step runs for n (CUDA graphs: its bucket)

    def run_tokens(self, per_row: int | np.ndarray) -> int | np.ndarray:
        """Tokens per row a step runs to verify `per_row` (root included): what its seconds follow
        (a compiled step with CUDA graphs pads a tree up to its bucket; else the count itself)."""
        if self.pad is None:
            return per_row
        if isinstance(per_row, np.ndarray):
            return np.array([self.pad(int(n)) for n in per_row.ravel()], dtype=per_row.dtype).reshape(per_row.shape)
        return self.pad(int(per_row))

    def verify_s(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """Seconds of verifying `tokens` tokens (a number or an array of them): the line. (A
        monotone curve per token band ran within noise of it, 0.96-1.01x: removed, see git.)"""
        return self.at(tokens)

    def observe_ar(self, rows: int, seconds: float, alpha: float = 0.2) -> None:
        """A verify of the roots alone (an AR step, or a tree truncated to no node)."""
        self.ar[rows] = _ema(self.ar.get(rows), seconds, alpha)

    def ar_s(self, rows: int) -> float:
        """Seconds of verifying `rows` roots without nodes: the line's value, or what such steps
        measured where that is less. The line is fitted mostly on steps that verified trees, so its
        residuals are ~0 on them: an AR step measured below it does not pay their fixed costs (the
        tree mask, the walk, a proposer learning from every node's logits) - measured, Token
        Recycling drafted 2.5-3.7 nodes per step at batch 2-4 where AR was 5-9% faster. One
        measured above it says the line misses the curve at few tokens, which small trees share,
        so AR keeps the line (measured at batch 16 with an 80-node budget: taking the measured AR
        there drafted 1.4 nodes per step and lost 18% to AR)."""
        line = self.verify_s(rows)
        return min(self.ar.get(rows, line), line)

    def observe_draft(self, depth: int, seconds: float, rows: int = 0, alpha: float = 0.2) -> None:
        """A draft of `depth` depths that expanded `rows` rows per depth (slots x width)."""
        if depth > 0:
            per = seconds / depth
            self.draft_step = _ema(self.draft_step or None, seconds, alpha)  # 0: not measured yet
            self.draft_per_depth = _ema(self.draft_per_depth or None, per, alpha)
            if rows > 0:
                self.draft_fit.observe(rows, per)

    def observe_proposer_draft(self, nodes: int, seconds: float) -> None:
        """A training-free proposer's whole draft (the policy's choice over it included) that built
        `nodes` nodes per slot."""
        self.nodes_fit.observe(nodes, seconds)

    def proposer_draft_s(self, nodes: int | np.ndarray) -> float | np.ndarray:
        """Seconds of a proposer's draft bounded at `nodes` nodes per slot: the fit once the drafted
        sizes have varied, else the mean of whole drafts. An ordinary step's draft is bounded at the
        nodes its plan verifies, explorations and probes draft up to the budget and learn from all of
        it: their mean is no ordinary step's price (measured on 2 cores, Token Recycling at batch 4:
        0.24-0.29 ms for an ordinary draft of 1-8 nodes, 0.9 ms the mean that kept AR where one
        node per step ran 6% faster)."""
        return self.nodes_fit.at(nodes) if self.nodes_fit.varied else self.draft_step

    def draft_depth_s(self, rows: int | np.ndarray) -> float | np.ndarray:
        """Seconds of one drafting depth expanding `rows` rows: the fit once the widths have varied,
        else the mean per depth."""
        return self.draft_fit.at(rows) if self.draft_fit.varied else self.draft_per_depth

    def observe_commit(self, verified_nodes: bool, seconds: float, alpha: float = 0.2) -> None:
        old = self.commit_tree if verified_nodes else self.commit_ar
        new = _ema(old if old >= 0 else None, seconds, alpha)  # < 0: not measured yet
        if verified_nodes:
            self.commit_tree = new
        else:
            self.commit_ar = new

    def observe_step(self, wall_s: float, verify_s: float, draft_s: float, verified_nodes: bool,
                     alpha: float = 0.1) -> None:
        """A step's wall seconds since the previous step ended, admissions' prefills left out."""
        other = wall_s - verify_s - draft_s - (self.commit_extra() if verified_nodes else 0.0)
        self.overhead = _ema(self.overhead if self.overhead >= 0 else None, max(other, 0.0), alpha)

    def ar_step_s(self, rows: int) -> float:
        """Seconds of a whole AR step over `rows` slots: what every step pays and AR's verify."""
        return self.overhead_s() + self.ar_s(rows)

    def overhead_s(self) -> float:
        """Seconds every step pays besides its draft, verification and commit extra (0 until measured)."""
        return max(self.overhead, 0.0)

    def commit_extra(self) -> float:
        """Seconds a step that verified nodes spends committing beyond an AR step (0 until both
        have been measured)."""
        return max(self.commit_tree - self.commit_ar, 0.0) if min(self.commit_tree, self.commit_ar) >= 0 else 0.0


class AcceptanceModel:
    """P(a draft node is accepted), calibrated by what verification accepts.

    With `max_nodes` (training-free proposers, whose nodes carry no score), also per node index:
    a proposer's nodes come in its own order (Token Recycling's template, best candidates first;
    a chain's depth), and a node's place in it says more than its depth (a template's first child
    of a level is accepted several times as often as its eighth: the mean of a depth undervalues
    the first nodes, and the plan found an 8-node tree not worth drafting that beat AR by 8%). An
    index's estimate starts from its depth's and is pulled to its own counts as they grow."""

    def __init__(self, max_depth: int = 64, max_nodes: int = 0):
        # per key: accepted and seen counts, starting from a prior of _PRIOR_WEIGHT pseudo-observations
        self.conf_acc = _PRIOR_WEIGHT * (np.arange(_BUCKETS, dtype=np.float64) + 0.5) / _BUCKETS
        self.conf_seen = np.full(_BUCKETS, _PRIOR_WEIGHT)
        self.depth_acc = _PRIOR_WEIGHT * 0.5 ** np.arange(max_depth + 1, dtype=np.float64)
        self.depth_seen = np.full(max_depth + 1, _PRIOR_WEIGHT)
        self.node_acc = np.zeros(max_nodes)  # per node index (no prior: the depth's)
        self.node_seen = np.zeros(max_nodes)
        self._by_key: dict[bool, np.ndarray] = {}  # P(accepted) per bucket (True) / depth (False), until observed
        self._col_cache: dict[int, np.ndarray] = {}  # _cols per column count

    def bucket_p(self) -> np.ndarray:
        """(buckets,) P(accepted) per confidence bucket, non-decreasing in confidence (as `predict`
        keeps a score-ordered row non-increasing)."""
        p_K = self._by_key.get(True)
        if p_K is None:
            p_K = self._by_key[True] = np.minimum.accumulate((self.conf_acc / self.conf_seen)[::-1])[::-1]
        return p_K

    def depth_p(self) -> np.ndarray:
        """(depths,) P(accepted) per draft depth."""
        p_D = self._by_key.get(False)
        if p_D is None:
            p_D = self._by_key[False] = self.depth_acc / self.depth_seen
        return p_D

    def _cols(self, n: int) -> np.ndarray:
        """(n,) the node index of each of n columns (the last index holds every later node), cached."""
        c_N = self._col_cache.get(n)
        if c_N is None:
            c_N = self._col_cache[n] = np.minimum(np.arange(n), len(self.node_seen) - 1)
        return c_N

    def keys(self, score_BN: np.ndarray | None, depth_BN: np.ndarray) -> np.ndarray:
        """(B, N) each node's key (host arrays in): its confidence bucket where the nodes are scored,
        else its depth."""
        # (np.minimum / np.maximum: np.clip's wrapper costs more than the arithmetic at this size)
        if score_BN is not None:  # bucket k holds exp(score) in [k, k + 1) / buckets: log-edges, one call
            return np.searchsorted(_LOG_EDGES, score_BN, side="right")
        return np.minimum(np.maximum(depth_BN, 0), len(self.depth_seen) - 1)

    def predict(self, score_BN: torch.Tensor | np.ndarray | None, depth_BN: torch.Tensor | np.ndarray) -> np.ndarray:
        """(B, N) probabilities; along each row non-increasing where the nodes are ordered by score
        (a prefix never values a node above one before it)."""
        score = None if score_BN is None else _host(score_BN)
        return self.p_of(self.keys(score, _host(depth_BN)), score is not None)

    def p_of(self, key_BN: np.ndarray, scored: bool) -> np.ndarray:
        """(B, N) probabilities of nodes by their `keys` (a step's keys serve its choice and its
        observation: computed once)."""
        p_BN = (self.bucket_p() if scored else self.depth_p())[key_BN]
        if not p_BN.size:
            return p_BN
        if not scored and len(self.node_seen):  # by index, from the depth's
            i_N = self._cols(p_BN.shape[1])
            return (self.node_acc[i_N] + _PRIOR_WEIGHT * p_BN) / (self.node_seen[i_N] + _PRIOR_WEIGHT)
        return np.minimum.accumulate(p_BN, axis=1)

    def observe(self, score_BN: torch.Tensor | np.ndarray | None, depth_BN: torch.Tensor | np.ndarray,
                real_BN: torch.Tensor | np.ndarray, accepted_BN: torch.Tensor | np.ndarray) -> None:
        """Count every real (not padded) verified node and whether the walk accepted it."""
        score = None if score_BN is None else _host(score_BN)
        self.observe_keys(self.keys(score, _host(depth_BN)), score is not None, _host(real_BN).astype(bool),
                          _host(accepted_BN))

    def observe_keys(self, key_BN: np.ndarray, scored: bool, real_BN: np.ndarray, hit_BN: np.ndarray) -> None:
        """`observe` on the nodes' `keys` (bool `real_BN`)."""
        acc, seen = (self.conf_acc, self.conf_seen) if scored else (self.depth_acc, self.depth_seen)
        keys, hit = key_BN[real_BN], hit_BN[real_BN].astype(np.float64)
        self._by_key.clear()
        seen += np.bincount(keys, minlength=len(seen))
        acc += np.bincount(keys, weights=hit, minlength=len(acc))
        if not scored and len(self.node_seen) and real_BN.size:  # per column, then per node index
            i_N = self._cols(real_BN.shape[1])
            self.node_seen += np.bincount(i_N, weights=real_BN.sum(0), minlength=len(self.node_seen))
            self.node_acc += np.bincount(i_N, weights=(hit_BN * real_BN).sum(0), minlength=len(self.node_acc))


def step_seconds(cost: CostModel, rows: int, n_max: int, draft_s: float = 0.0) -> np.ndarray:
    """(n_max + 1,) seconds of a step verifying N = 0..n_max nodes per slot over `rows` slots: what
    every step pays, then AR's verify (N = 0) or the draft, the commit extra and the verify of
    rows x (1 + N) tokens (padded up to their bucket under CUDA graphs: `CostModel.run_tokens`)."""
    seconds_N = np.empty(n_max + 1)
    other = cost.overhead_s()
    seconds_N[0] = cost.ar_step_s(rows)
    if n_max:
        verify = cost.verify_s(cost.run_tokens(np.arange(2, n_max + 2, dtype=np.float64)) * rows)
        seconds_N[1:] = other + (draft_s + cost.commit_extra() + verify)
    return seconds_N


def choose_nodes(p_BN: torch.Tensor | np.ndarray, active_B: torch.Tensor | np.ndarray, rows: int, cost: CostModel,
                 draft_s: float = 0.0, cap: int | None = None, rate: float | None = None) -> tuple[int, list[float]]:
    """The node count N (0..p.shape[1], at most `cap`) that maximises expected committed tokens
    per second of the whole step: (n_active + sum over active rows of their first N p's) /
    (draft_s + t_verify(rows * (1 + N)) + t_commit extra where N > 0, + what every step pays).
    Returns (N, goodput of every N considered).

    With `rate` (the long-run tokens per second the steps reach, drafting included), N maximises
    tokens - rate x seconds instead: once a draft is paid, a node is worth verifying when it
    yields more than the time it takes would yield at that rate. The step's own ratio, without the
    paid draft, overstates the rate and verifies too few nodes (measured on two cores at batch 2:
    ~5 nodes per step where a fixed 8-node tree was 10% faster)."""
    p, active = _host(p_BN), _host(active_B).astype(bool)
    n_max = p.shape[1] if cap is None else min(p.shape[1], max(cap, 0))
    value_N = _value(p[:, :n_max], active)
    seconds_N = step_seconds(cost, rows, n_max, draft_s)
    rates = value_N / np.maximum(seconds_N, 1e-300)  # (no second is free: a floor, not an error state)
    score = value_N - rate * seconds_N if rate is not None else rates
    return int(score.argmax()), rates.tolist()  # ties: the first, the smaller tree


def could_pay(depth_BN: np.ndarray, real_BN: np.ndarray, active_B: np.ndarray, seconds_N: np.ndarray) -> int:
    """The most nodes N (< len(seconds_N)) of a drafted tree whose step could beat an AR step were
    every node accepted: then each active row commits 1 + the depth of its deepest real node among
    its first N, so N can pay only where (1 + that depth, the deepest over the rows) / seconds_N
    >= 1 / seconds_0 (the draft is paid: `step_seconds` without it). An exploration verifies no
    more: beyond, it would teach acceptance no plan can use, at the cost of many AR steps (measured
    on 2 cores: Token Recycling's 80-node exploration at batch 8 took 73 ms, ten AR steps, where
    a whole path of its template holds at most 7 tokens)."""
    n_max = len(seconds_N) - 1
    rows = active_B & real_BN[:, :n_max].any(1)
    if n_max < 1 or not rows.any():
        return 0
    deepest_N = np.maximum.accumulate(np.where(real_BN[rows, :n_max], depth_BN[rows, :n_max], 0), axis=1).max(0)
    pays_N = (1 + deepest_N) * seconds_N[0] >= seconds_N[1:]
    return int(np.flatnonzero(pays_N)[-1]) + 1 if pays_N.any() else 0


def _value(p_BN: np.ndarray, active_B: np.ndarray) -> np.ndarray:
    """(N + 1,) expected committed tokens of a step verifying the first 0..N nodes of each active row."""
    value_N = np.empty(p_BN.shape[1] + 1)
    value_N[0] = 0.0
    np.cumsum(p_BN[active_B].sum(0), out=value_N[1:])
    return value_N + int(active_B.sum())


class _Curves:
    """V_d(N) of the trees drafted at one width: expected accepted drafts per slot of the best N nodes
    of a depth-d tree, d = 1..depth, N = 0..budget (see `learn`).

    For a drafter that scores its nodes the curves hold what the drafts were, not what they were
    worth: per (d, N) the mean count of the best N nodes in each confidence bucket, weighed by the
    acceptance model's calibration at plan time (`V`). A curve learnt from p's would keep the
    calibration of the time it was learnt: the deep curves, learnt from the rarer deep drafts, would
    be weighed on an older calibration than the shallow ones (measured: the first exploration's
    curves, on the prior's calibration, kept a slowly learning plan on a 2-deep chain, 0.88x of the
    CPU tree). A proposer's nodes carry no score: its curves hold p's (one 'bucket' worth 1)."""

    def __init__(self, budget: int, depth: int, alpha: float, depth_scaled: bool,
                 prior_DM: np.ndarray | None = None, prior_weight: float = 0.0):
        self.budget, self.depth, self.alpha, self.depth_scaled = budget, depth, alpha, depth_scaled
        # the drafter's own figures as V_d(N), d = 1..depth, N = 0..budget (`prior_curves`), worth
        # prior_weight slot-trees against those learnt (None: the curves are what the trees taught)
        self.prior_DM, self.prior_weight = prior_DM, prior_weight
        self._rows = np.zeros((depth + 1, budget + 1))  # slot-trees that taught each V_d(N)
        self._gain: np.ndarray | None = None  # (depth + 1, budget + 1, K): V_d - V_{d-1} (V_0 = 0) per bucket, EMA
        self._known = 0  # depths 1.._known have a gain (a tree drafted to depth d measures 1..d)
        self._n = np.zeros((depth + 1, budget + 1))  # trees that taught each V_d(N)
        self._V_KMK: np.ndarray | None = None  # the gains summed over depth, d = 1.._known; None: none yet
        self._buckets = 0  # what the curves hold: counts per confidence bucket, or (0) p's

    def learn(self, x_BN: np.ndarray, depth_BN: np.ndarray, active_B: np.ndarray, drafted: int,
              narrowed: int | None = None, learn_every: int = 1, buckets: int = 0) -> None:
        """V_d(N) for every d up to the depth this tree was drafted to: its nodes of depth <= d in
        order (a prefix of the same order a depth-d tree would have), mean over active slots of
        their cumulative worth - with `buckets`, x holds each node's confidence bucket (-1: not a
        real node) and the worth is a count per bucket; else x holds p's. Where the budget kept no
        node deeper than some d' < drafted, the curves of d' .. drafted are the same: drafting
        deeper would have bought nothing. A tree `narrowed` to width w holds the best N nodes of a
        tree drafted at this class's width for N <= w only: it updates V_d(0..w).

        Kept as V_1 plus the gains of each further depth, V_d - V_{d-1}, each averaged over the trees
        drafted at least that deep: a deep draft is rarer (explorations, probes) and comes from other
        states than the shallow ones, so a deep curve learnt apart from the shallow ones is compared
        with them on other states (measured: V_4 below V_3, and the plan kept drafts shallower than
        the fixed tree that beat it); a gain is measured on the same tree as its base, >= 0. Each
        V_d(N) is the running mean of its first trees, then an EMA weighing each new tree a (the
        first tree kept whole until forgetting caught up held a slowly learning plan on the
        warm-up's first trees: measured on 2 cores, a = 0.03 drafted a 2-deep chain at 0.88x of the
        CPU tree, 0.99x with the running mean)."""
        if not bool(active_B.any()) or drafted < 1:
            return
        # a proposer's chain may run deeper than the tree config's depth: the deepest curve holds it
        x_AN, dep_AN = x_BN[active_B], np.minimum(depth_BN[active_B], self.depth)
        D, M = min(drafted, self.depth), self.budget + 1
        d_D11 = np.arange(1, D + 1)[:, None, None]
        kept_DAN = (dep_AN[None] <= d_D11) & (x_AN[None] >= 0 if buckets else True)
        # each kept node's place N in a depth-d tree: a drafter's nodes come by score, so a shallower
        # tree holds the first kept of them (its rank among them); a proposer's whole tree is drafted
        # and truncated in its own order (its index). The curve at N counts the nodes placed <= N
        # (mean over slots; per bucket, or their p's): one histogram of the places, then a cumsum
        # (sorting the nodes per depth cost ~4x as much: the policy's largest share at batch 2)
        if self.depth_scaled:
            at_DAN = kept_DAN.cumsum(2)
        else:
            at_DAN = np.broadcast_to(np.arange(1, x_AN.shape[1] + 1), kept_DAN.shape)
        K = buckets or 1
        d_I, a_I, n_I = np.nonzero(kept_DAN & (at_DAN < M))
        flat_I = (d_I * M + at_DAN[d_I, a_I, n_I]) * K + (x_AN[a_I, n_I] if buckets else 0)
        hist = np.bincount(flat_I, weights=None if buckets else x_AN[a_I, n_I].astype(np.float64), minlength=D * M * K)
        curve_DMK = hist.reshape(D, M, K).cumsum(1) / x_AN.shape[0]  # N = 0..budget, flat past the tree's nodes
        gain_DMK = np.diff(curve_DMK, axis=0, prepend=np.zeros((1, *curve_DMK.shape[1:])))
        if self._gain is None:
            self._gain, self._buckets = np.zeros((self.depth + 1, M, gain_DMK.shape[2])), buckets
        # the trees taught: N <= w of a narrowed one, and every N never taught before
        n_DM = self._n[1: D + 1]
        taught_DM = (np.arange(M) < (M if narrowed is None else narrowed + 1)) | (n_DM == 0)
        n_DM += taught_DM
        self._rows[1: D + 1] += taught_DM * x_AN.shape[0]
        a = 1 - (1 - self.alpha) ** learn_every  # one tree in learn_every: the same memory in steps
        a_DM1 = np.where(taught_DM, np.maximum(a, 1.0 / np.maximum(n_DM, 1)), 0.0)[..., None]
        self._gain[1: D + 1] += a_DM1 * (gain_DMK - self._gain[1: D + 1])
        self._known = max(self._known, D)
        self._V_KMK = self._gain[1: self._known + 1].cumsum(0)

    def knows(self, d: int) -> bool:
        """Whether depth d has a learnt curve (a tree drafted at least that deep has taught it)."""
        return self._known >= d

    def plannable(self) -> bool:
        """Whether every depth has a curve to plan on: learnt, or the drafter's figures."""
        return self.prior_DM is not None or self.knows(self.depth)

    def _weighed(self, worth_K: np.ndarray) -> np.ndarray:
        """(depth, budget + 1) V_d(N), N = 0..budget, each bucket at `worth_K` (a proposer's p's as
        they are), blended with the prior (n learnt slot-trees against its weight W: (n V + W
        V_prior) / (n + W)); NaN for a depth with neither."""
        V_DM = np.full((self.depth, self.budget + 1), np.nan)
        if self._V_KMK is not None:
            V_DM[: self._known] = self._V_KMK @ (worth_K if self._buckets else np.ones(1))
        if self.prior_DM is None:
            return V_DM
        n_DM, W = self._rows[1:], self.prior_weight
        return np.where(np.isnan(V_DM), self.prior_DM, (n_DM * np.nan_to_num(V_DM) + W * self.prior_DM) / (n_DM + W))

    def V(self, worth_K: np.ndarray) -> np.ndarray | None:
        """(depth, budget): V_d(N), d = 1..depth, N = 1..budget (-1: no curve for that depth yet);
        None before any tree and without a prior."""
        if self._V_KMK is None and self.prior_DM is None:
            return None
        return np.nan_to_num(self._weighed(worth_K)[:, 1:], nan=-1.0)

    def V_upper(self, worth_K: np.ndarray, z: float) -> np.ndarray:
        """(depth, budget): an upper confidence bound on V_d(N) - what the acceptance still to be
        revealed could make it: V + z x cap / sqrt(n), at most cap = min(d, N) (every node of the
        path accepted), where n is the slot-trees behind the value (the drafter's figures count as
        their weight); cap itself where nothing is known. (Hoeffding: a slot-tree's yield lies in
        [0, cap]; z = 1.22 is its one-sided 95% bound.)"""
        d_D1, n_1N = np.arange(1, self.depth + 1)[:, None], np.arange(1, self.budget + 1)[None]
        cap_DN = np.minimum(d_D1, n_1N).astype(np.float64)
        if self._V_KMK is None and self.prior_DM is None:
            return cap_DN
        V_DN = self._weighed(worth_K)[:, 1:]
        n_DN = self._rows[1:, 1:] + (self.prior_weight if self.prior_DM is not None else 0.0)
        upper_DN = np.minimum(cap_DN, np.nan_to_num(V_DN) + z * cap_DN / np.sqrt(np.maximum(n_DN, 1.0)))
        return np.where(np.isnan(V_DN), cap_DN, upper_DN)

    def value(self, worth_K: np.ndarray) -> list[list[float] | None]:
        """V_d(N), N = 0..budget, per d = 0..depth (None: d = 0 and depths with no curve yet)."""
        if self._V_KMK is None and self.prior_DM is None:
            return [None] * (self.depth + 1)
        return [None] + [None if np.isnan(row[0]) else row.tolist() for row in self._weighed(worth_K)]


def prior_curves(top1_D, depth: int, budget: int) -> np.ndarray:
    """(depth, budget + 1) V_d(N) from a drafter's top-1 agreement per draft step a_1, a_2, ...
    (as training measured it; a_last again past the last measured step): the expected accepted
    nodes of the top-1 chain within the first N nodes of a depth-d tree,
        V_d(N) = sum_{k <= min(d, N)} prod_{i <= k} a_i,
    a node of depth k accepted iff its whole path is. Every other node counts 0: a lower bound for
    a wider tree (its other nodes only add), so the prior favours a chain until trees show more."""
    a_D = np.asarray(list(top1_D)[:depth], dtype=np.float64)
    a_D = np.concatenate([a_D, np.full(depth - len(a_D), a_D[-1])])
    chain_D = np.cumsum(np.cumprod(np.clip(a_D, 0.0, 1.0)))  # accepted within a chain of d nodes
    chain_K = np.concatenate([[0.0], chain_D])  # k = 0..depth
    d_D1, n_1M = np.arange(1, depth + 1)[:, None], np.arange(budget + 1)[None]
    return chain_K[np.minimum(d_D1, n_1M)]


def _halvings(width: int) -> list[int]:
    """width, halved (rounding up) down to 1, ascending: 6 -> [1, 2, 3, 6]."""
    out = [width]
    while out[-1] > 1:  # (w + 1) // 2 < w for w > 1: no repeats
        out.append((out[-1] + 1) // 2)
    return out[::-1]


class GoodputPolicy:
    """Per engine: the cost and acceptance models and the two choices each step makes with them.

    Before drafting, `plan` picks the draft depth d (0: no draft, a plain AR step) and after it
    `choose` the node count N, both maximising expected committed tokens per second:
        (n_active (1 + V_d(N))) / (d x draft seconds per depth + t_verify(rows (1 + N)))
    where V_d(N) is the expected accepted drafts per slot of the best N nodes of a depth-d tree,
    learnt from the calibrated acceptance of the nodes of recent trees (a depth-d tree holds the
    candidates of depth <= d of a deeper one: drafting expands depth by depth). After drafting the
    depth's cost is spent, so `choose` weighs only verification - against the plan's expected rate
    (tokens - rate x seconds), not the step's own ratio, which leaves the paid draft out.

    With `width` (a feature drafter's EAGLE-2 tree: each depth expands the `width` best nodes into
    `width` children each), `plan` also narrows the draft to w = min(width, N) for the N it expects
    to verify, at no loss: the best N nodes of a tree are ancestor-closed and the best at their depth,
    so a tree expanding the best N per depth holds exactly the best N nodes of the full-width tree.
    A draft's seconds per depth are a line in the rows it expands (slots x w), fitted as the widths
    vary; V_d(N) is learnt from a narrowed tree for N <= w only (beyond, full-width trees - the
    explorations and probes - keep it). The plan also weighs narrower draft classes (the width halved
    down to a chain: `classes`), each with value curves of its own learnt from the trees drafted that
    wide (an exploration drafts each class in turn): fewer rows per depth cost less, and where a
    depth costs more than the few nodes a wider draft adds are worth (a CPU at batch 1; a confident
    drafter at batch 16, whose best few nodes are one chain), the narrower class wins.

    The first two steps calibrate the costs cheaply (`calibrate`: a one-node chain, an AR step);
    then, while learning may run, the steps explore (the full tree, half and a quarter of the
    budget, then the full budget at each narrower width class; with several width classes, the
    list over again until each entry has taught `explore_rows` slot-trees) so that the
    cost fit sees several token counts at this batch size and context - its calibration on the
    running hardware; then one such step, drafted at full depth, keeps the fit and the value curves
    current: `reexplore` steps after the last one, or later where an exploration cost more than
    `explore_share` of the steps between two of them (a full tree at batch 16 costs several
    ordinary steps). Where no draft pays (plan says 0), a full-depth probe still runs after a pause
    that doubles up to `max_pause` steps, or longer where one probe costs more than
    `probe_share` of that many AR steps (a full tree at batch 16 costs several AR steps: probing
    every 64 steps cost a training-free proposer 10% against AR where its drafts never paid). A
    probe verifies as the full exploration does (no more nodes than could pay): choosing its nodes
    by the plan that said AR would verify none, and a proposer, whose acceptance is learnt from
    verified nodes only, would stay on the estimate of its first explorations (measured at batch 4:
    Token Recycling's first node at 1 accepted in 11 kept AR for a whole run where one node per
    step ran 6% faster). Where drafts pay, an AR probe (`ar_probe_steps` AR steps in a row, AR
    measured on the second) still comes after `ar_probe_every` drafting steps or more, so that
    AR's seconds are measured on ordinary AR steps rather than read off the trees' line: the gap
    grows until what a probe loses to the plan is `ar_probe_share` of the steps between (`_ar_gap`).
    A plan is reused for `replan_every` steps while the active slots stay the same; every learning
    step plans again.

    `depth_scaled=False` (training-free proposers): a draft costs what it costs whatever the depth
    planned - a proposer builds its whole tree (Token Recycling's template, a PLD chain) - so the
    plan is all or nothing: the full depth at the measured seconds of a draft bounded at the N it
    verifies (`CostModel.proposer_draft_s`, a line in N: explorations draft their own N), or AR; its
    acceptance is learnt per node index (AcceptanceModel) from every drafted step. (Planning
    a shallow draft at a depth's share of a proposer's cost chose to draft where it did not pay.)
    An ordinary step bounds the proposer's draft at the N it planned (`draft_nodes`): measured on
    2 cores, Token Recycling building its whole 80-node template per slot every step to keep ~6
    nodes cost 7.5% of the wall time at batch 2.

    `prior` (a trained drafter's top-1 agreement per draft step, saved with it: `FoveaDrafter.
    acceptance`): every width class's value curves start from `prior_curves` of those figures, worth
    `explore_rows` slot-trees against the trees that teach them - as much as the repeated first
    explorations would have taught each entry, which then run once (the cost fit still needs every
    shape once); and the figures count as `explore_rows` slot-trees of their chain's accepted nodes
    towards `settle_accepted`, so a drafter whose own figures say it cannot pay settles on AR once
    the plan is AR and the learning budget is spent, without trees of its own. Without figures (an
    untrained drafter, one saved before they were, a training-free proposer) the curves start from
    nothing, as before: the first explorations teach them, within the floor's learning budget.

    One policy may serve several engines in turn (`DecodeEngine(policy=...)`: a generate actor's
    engines of one method and batch size share it, so its later shards start from what the first
    ones learnt); `begin` drops what belonged to the last engine's step in flight, the stats add
    up over all of them."""

    def __init__(self, budget: int, depth: int, width: int | None = None, depth_scaled: bool = True,
                 prior: tuple[float, ...] | None = None, config: GoodputConfig | None = None):
        self.cfg = cfg = GoodputConfig() if config is None else config
        self.cost = CostModel()
        self.acceptance = AcceptanceModel(max_nodes=0 if depth_scaled else budget)
        self.depth_scaled = depth_scaled
        self.budget, self.depth = budget, depth
        self.width = width                     # None: the draft's width is not the policy's to choose
        self.draft_width = width               # this step's planned width
        self.draft_nodes: int | None = None    # this step's bound on a proposer's draft (None: the budget)
        # the draft widths a plan chooses among (then narrowed to min(w, N)): the full width, then
        # halved down to a chain (6, 3, 2, 1) - a narrower draft costs less per depth and loses little
        # where few nodes pay (measured on 2 cores: at batch 1 a fixed 3-wide 6-deep 12-node tree
        # 1.91x AR where the policy drafting 6 wide reached 1.79x; at batch 16 a 3-deep chain 1.50x
        # where the policy, its narrowest class 3 wide, reached 1.24x)
        self.classes: list[int | None] = [None] if width is None else _halvings(width)
        prior_DM = prior_curves(prior, depth, budget) if prior else None
        self.curves = [_Curves(budget, depth, cfg.alpha, depth_scaled, prior_DM, cfg.explore_rows) for _ in self.classes]
        # the figures' accepted nodes per slot-tree, as explore_rows slot-trees towards _hopeless
        self._prior_trees = (cfg.explore_rows, cfg.explore_rows * prior_DM[-1, -1]) if prior_DM is not None else (0, 0.0)
        self._class = self._plan_class = len(self.classes) - 1  # this step's width class, the last plan's
        # explorations: (node count, width class) - the full tree, half and a quarter of the budget
        # at the full width, then the whole budget at each narrower width
        full = len(self.classes) - 1
        self.explore = [(budget, full), (max(1, budget // 2), full), (max(1, budget // 4), full)] + [
            (budget, c) for c in range(full)]
        # the first steps explore the list as many times over as give each entry `explore_rows`
        # slot-trees (rounds fixed at the first plan, by its active slots; one width class: once)
        self._initial = cfg.calibrate + len(self.explore)  # steps of calibration and first explorations
        self.rate: float | None = None  # the planned step's expected tokens per second per active slot
        self._drafted, self._probe = 0, False  # drafting steps so far; whether this step is a probe
        self.step_s = 0.0                      # seconds of an ordinary step's draft + verify (EMA)
        self._next_explore, self._cycle, self._due = cfg.reexplore, 1, None  # the next re-exploration
        n_N = np.arange(1, budget + 1, dtype=np.float64)  # the plan's grid: node counts, widths, depths
        self._grid = (n_N, [np.minimum(n_N, w) if w is not None else np.ones_like(n_N) for w in self.classes],
                      np.arange(1, depth + 1, dtype=np.float64)[:, None])
        self.steps, self.pause, self.idle = 0, 1, 0
        # the last plan: ((active slots, rows), step, (depth, nodes)) - reused until the value curves move
        # or the slots change, an AR plan until then, a draft for `replan_every` steps
        self._planned: tuple[tuple[int, int], int, tuple[int, int]] | None = None
        self.chosen: list[int] = []            # node count per step (0: AR)
        self.depths: list[int] = []            # draft depth per step (0: none)
        self.widths: list[int] = []            # planned draft width per drafting step (width planned)
        self.predicted, self.accepted = 0.0, 0.0  # summed over verified real nodes (calibration)
        self.tried_rows = 0  # slot-trees those nodes came in
        self._step = None  # the chosen tree's keys for observe (`choose`)
        self._drafted_nodes = 0  # nodes per slot the step's draft built (`choose`; 0 where it built none)
        self._plans, self._seconds = 0, (None, None)  # plans weighed so far; their seconds (_plan_seconds)
        # drafting steps planned back to back take an AR probe (`ar_probe_steps` AR steps) in `ar_probe_every`
        # or more (`_ar_gap`): AR's seconds stay measured on ordinary AR steps (`CostModel.ar_s`)
        self._since_ar, self._ar_left = 0, 0  # (AR steps left of a probe)
        self._prev_ar = False  # whether the last step verified no node (`observe`)
        self._ar_probe_loss = 0.0  # (seconds a probe loses to the plan)
        # the floor (`_may_learn`): what learning lost to AR so far, against AR's seconds so far
        self.ar_time = 0.0     # seconds AR would have taken for the tokens committed so far
        self.learn_loss = 0.0  # seconds the learning steps took beyond AR's for their tokens (< 0: they gained)
        self.explorations, self.probes = 0, 0  # learning steps run
        # AR for good: set where the plan is AR and no learning may run (`plan`); the engine then
        # stops keeping the drafter's state (feeding it every token, prefilling it for new requests),
        # which on AR steps costs what no draft will repay (measured on 2 cores, an untrained FOVEA
        # drafter on a random small-size LLaVA: 98-99% AR steps, 0.83-0.86x AR's speed at batch 4)
        self.settled, self._settled_ar_s = False, 0.0  # (an AR step's seconds when it settled; `_hopeless`)
        self._learn_memo: tuple = (None, None, 0.0, True)  # `_weigh_learning`'s, for the plan it was weighed on

    def begin(self) -> None:
        """A new engine takes this policy over: what the last one's step in flight left (its tree's
        keys, a probe or an AR probe under way, the last plan) goes; what was learnt stays."""
        self._step, self._probe, self._ar_left, self._prev_ar = None, False, 0, False
        self._planned, self._seconds = None, (None, None)

    @property
    def value(self) -> list[list[float] | None]:
        """V_d(N) of the full-width trees."""
        return self.curves[-1].value(self._worth())

    def _worth(self) -> np.ndarray:
        """What a node of each confidence bucket is worth now: the calibration a scored drafter's
        value curves are weighed at (a proposer's hold p's)."""
        return self.acceptance.bucket_p()

    def _exploring(self) -> int | None:
        """This step's exploration index, or None."""
        if self.settled:
            return None
        if self.steps < self.cfg.calibrate:
            return None
        if self.steps < self._initial:
            return (self.steps - self.cfg.calibrate) % len(self.explore)
        return self._due

    def plan(self, n_active: int, rows: int) -> int:
        """The draft depth for this step (0: decode one token, AR)."""
        if self.settled:  # AR for good
            self.draft_width, self._probe, self.draft_nodes, self._drafted_nodes = self.width, False, None, 0
            self.depths.append(0)
            return 0
        if self.steps == self.cfg.calibrate and len(self.classes) > 1 and not self._prior_trees[0]:  # figures: one round
            self._initial = self.cfg.calibrate + len(self.explore) * max(1, math.ceil(self.cfg.explore_rows / max(n_active, 1)))
        if self.steps < self.cfg.calibrate:  # a one-node chain, then an AR step: every cost term measured, cheaply
            self.draft_width, self._probe, self._class = self.classes[0], False, 0
            self.draft_nodes, self._drafted_nodes = (1 if not self.depth_scaled else None), 0
            d = 1 if self.steps == 0 else 0
            self.depths.append(d)
            if d and self.draft_width is not None:
                self.widths.append(self.draft_width)
            return d
        k = self._exploring()
        if k is not None and not self._may_learn(rows, *self.explore[k % len(self.explore)]):
            self._initial = min(self._initial, self.steps)  # the first explorations end here,
            self._due, self._next_explore = None, self.steps + self.cfg.reexplore  # a re-exploration waits
            k = None
        # a periodic re-exploration while AR is chosen would be a probe as well: the probe's
        # doubling pause decides when to look again
        self.draft_width, self._probe, self._class = self.width, False, len(self.classes) - 1
        self.draft_nodes = None  # a proposer's draft bound (None: the whole budget)
        self._drafted_nodes = 0  # nodes per slot this step drafted (set by `choose`)
        if k is not None and (self.steps < self._initial or self.idle == 0):  # an exploration at its width class
            d = self.depth
            n_explore, self._class = self.explore[k % len(self.explore)]
            self.draft_width = self.classes[self._class]
            if not self.depth_scaled:  # a proposer drafts what the entry verifies:
                self.draft_nodes = max(n_explore, 1)  # its draft seconds are measured at several sizes
        else:
            last = self._planned
            if last is not None and last[0] == (n_active, rows) and (
                    last[2] == (0, 0) or self.steps - last[1] < self.cfg.replan_every):
                d, n = last[2]  # the last plan, while what it was weighed on has not moved but the cost fit:
            else:               # AR until the values move (the next probe's drafts move the fit again), a
                d, n = self._best_plan(n_active, rows)  # draft for replan_every steps
                self._planned = ((n_active, rows), self.steps, (d, n))
            planned_ar = d == 0
            if d > 0 and (self._ar_left or self._since_ar >= self._ar_gap()):  # what does an AR step cost now?
                self._ar_left = self._ar_left - 1 if self._ar_left else self.cfg.ar_probe_steps - 1
                d, n = 0, 0
            self._since_ar = self._since_ar + 1 if d > 0 else 0
            self.idle = self.idle + 1 if planned_ar else 0
            may_learn = planned_ar and self._may_learn(rows, self.budget, len(self.classes) - 1)
            if planned_ar and not may_learn and self._hopeless(rows, len(self.classes) - 1):  # AR for good
                self.settled, self._settled_ar_s = True, self.cost.ar_step_s(rows)
            if may_learn and self.idle > self.pause:  # probe: do drafts pay again?
                d, self.idle, self.pause = self.depth, 0, min(2 * self.pause, self.pause_limit(rows))
                self._probe = True
            elif d > 0:
                self.pause = 1
                if not self.depth_scaled:  # a proposer drafts no more than the plan can verify
                    self.draft_nodes = n
                self._class = self._plan_class
                self.draft_width = self._width(n)
        self.depths.append(d)
        if d and self.draft_width is not None:
            self.widths.append(self.draft_width)
        return d

    def _may_learn(self, rows: int, nodes: int, cls: int) -> bool:
        """Whether an exploration or a probe (a full-depth draft at width class `cls`, up to `nodes`
        verified) may run now: what learning lost to AR so far plus what this step is expected to
        lose (`_expected_loss`) is within `learn_share` of AR's seconds for the tokens committed so
        far plus `learn_allowance` AR steps, and some plan could beat AR at the acceptance still to
        be revealed (`may_pay`). (Counting the step's own loss keeps a step that costs more than the
        allowance - a full tree at batch 16: ~5 AR steps - from running on the allowance alone:
        measured with an untrained drafter at batch 16, 7% of AR's time lost to one such step.)"""
        expected, pays = self._weigh_learning(rows, nodes, cls)
        within = self.learn_loss + expected <= (self.cfg.learn_share * self.ar_time
                                                + self.cfg.learn_allowance * self.cost.ar_step_s(rows))
        return within and pays

    def _weigh_learning(self, rows: int, nodes: int, cls: int) -> tuple[float, bool]:
        """(`_expected_loss` >= 0, `may_pay`), weighed once per plan as the plan itself is (an AR
        plan stands until the values move): weighing them on every AR step cost ~0.3 ms a step, 4%
        of a batch-4 step of the `small` world on 2 cores (Token Recycling, AR planned on 60% of
        its steps)."""
        key = (rows, nodes, cls)
        memo = self._learn_memo
        if self._planned is None or memo[0] is not self._planned or memo[1] != key:
            memo = self._learn_memo = (self._planned, key, max(self._expected_loss(rows, nodes, cls), 0.0),
                                       self.may_pay(rows))
        return memo[2], memo[3]

    def _expected_loss(self, rows: int, nodes: int, cls: int) -> float:
        """Seconds a learning step is expected to lose to AR: a full-depth draft at width class `cls`,
        its nodes verified up to `nodes` or as few as could pay were all accepted (`could_pay`:
        along a chain, 1 + min(depth, N) tokens), less AR's seconds for the tokens its value curve
        expects it to commit (none past the bonus where nothing is known)."""
        t_ar = self.cost.ar_step_s(rows)
        w = self.classes[cls] or self.width or 1
        draft = (self.depth * self.cost.draft_depth_s(rows * w) if self.depth_scaled
                 else float(self.cost.proposer_draft_s(nodes)))
        seconds_N = step_seconds(self.cost, rows, nodes)
        chain_1N = np.minimum(np.arange(1, nodes + 1), self.depth)[None]  # a chain's depths, the best case
        n = could_pay(chain_1N, np.ones_like(chain_1N, dtype=bool), np.ones(1, dtype=bool), seconds_N)
        V = self.curves[cls].V(self._worth())
        value = float(max(V[-1, n - 1], 0.0)) if V is not None and n > 0 else 0.0
        return draft + float(seconds_N[n]) - (1 + value) * t_ar

    def _hopeless(self, rows: int, cls: int) -> bool:
        """Whether this drafter is past hope, so that the plan's AR may stand for good: no chain
        could pay even accepted, or the trees verified so far had fewer than `settle_accepted`
        nodes accepted per slot-tree (an untrained drafter: ~0). A drafter that pays somewhere
        accepts several per tree and is never settled: a plan that says AR after its first costly
        explorations (a large batch on a CPU) still probes later, as the learning budget allows."""
        if not self._weigh_learning(rows, self.budget, cls)[1]:
            return True
        rows_seen, accepted = self.tried_rows + self._prior_trees[0], self.accepted + self._prior_trees[1]
        return rows_seen > 0 and accepted / rows_seen < self.cfg.settle_accepted

    def may_pay(self, rows: int) -> bool:
        """Whether some plan could still beat an AR step at the acceptance learning may yet reveal:
        its value curves at their upper confidence bound (`_Curves.V_upper`, every node accepted
        where nothing is known) against its measured seconds. Where none could (a drafter that costs
        what the target does, as in the tiny world; a drafter whose own figures or trees say its
        nodes are seldom accepted), learning cannot buy anything: nothing is explored or probed.
        Before a draft is measured its seconds read 0: every draft could pay."""
        return bool(self._rates(rows, upper=True).max() > 1.0 / max(self.cost.ar_step_s(rows), 1e-12))

    def _ar_gap(self) -> int:
        """Drafting steps between two AR probes: `ar_probe_every`, or as many as make what a probe
        loses to the plan (its seconds x (1 - AR's rate / the plan's)) `ar_probe_share` of the steps
        between (measured on 2 cores at batch 2, where the plan ran 1.9x AR: a probe in 64 steps
        cost ~1%, one in 256 ran 2% faster against the fixed CPU tree)."""
        if self.step_s <= 0 or self._ar_probe_loss <= 0:
            return self.cfg.ar_probe_every
        return max(self.cfg.ar_probe_every, math.ceil(self._ar_probe_loss / (self.cfg.ar_probe_share * self.step_s)))

    def _width(self, n: int) -> int | None:
        """The draft width of this step's class that holds its best n nodes (None: not planned)."""
        w = self.classes[self._class]
        return None if w is None else max(1, min(w, n))

    def pause_limit(self, rows: int) -> int:
        """The longest pause between probes: max_pause, or as many AR steps as make one full-depth
        probe cost `probe_share` of them."""
        ar = self.cost.ar_s(rows)
        draft = (self.depth * self.cost.draft_depth_s(rows * (self.width or 1)) if self.depth_scaled
                 else self.cost.proposer_draft_s(self.budget))
        probe = draft + self.cost.commit_extra() + self.cost.verify_s(rows * self.cost.run_tokens(1 + self.budget))
        if ar <= 0:
            return self.cfg.max_pause
        return max(self.cfg.max_pause, math.ceil(probe / (self.cfg.probe_share * ar)))

    def _best_plan(self, n_active: int, rows: int) -> tuple[int, int]:
        """(draft depth, expected node count) of the highest expected rate; (0, 0): AR. Every (d, N)
        at once (a step's planning must cost little next to an AR step: 6 depths x 80 nodes)."""
        t_ar = self.cost.ar_step_s(rows)  # an AR step's seconds
        ar_rate = 1.0 / max(t_ar, 1e-12)  # tokens per second per active slot
        rate_CDN = self._rates(rows, upper=False)
        k = int(rate_CDN.argmax())  # row-major: then the shallower depth, then the fewer nodes
        best = float(rate_CDN.flat[k])
        self.rate = max(best, ar_rate)  # per active slot
        self._plans += 1
        self._ar_probe_loss = self.cfg.ar_probe_steps * t_ar * (1 - ar_rate / best) if best > ar_rate else 0.0
        self._plan_class, k = divmod(k, rate_CDN.shape[1] * self.budget)
        if not best > ar_rate:
            return 0, 0
        return (k // self.budget + 1 if self.depth_scaled else self.depth), k % self.budget + 1

    def _rates(self, rows: int, upper: bool) -> np.ndarray:
        """(classes, depths, N) expected tokens per second per active slot of every plan, by the value
        curves (`upper`: their upper confidence bound, `_Curves.V_upper`). A step's seconds count what
        every step pays besides its plan (`CostModel.overhead_s`): left out, a ratio prefers smaller
        trees (measured on two cores: 0.2-0.7 ms per step, 2-5% of a step - a small push towards the
        larger trees that fixed CPU trees showed to win)."""
        fixed = self.cost.overhead_s() + self.cost.commit_extra()  # any drafting step, besides its depth and verification
        n_N, w_CN, d_D1 = self._grid
        verify_N = self.cost.verify_s(rows * self.cost.run_tokens(1 + n_N))  # every candidate's verification at once
        rate_CDN = []
        worth_K = self._worth()
        for curves, w_N in zip(self.curves, w_CN):  # narrow classes first: ties go to the narrower draft
            V_DN = curves.V_upper(worth_K, self.cfg.optimism) if upper else curves.V(worth_K)
            if V_DN is None:
                rate_CDN.append(np.full((self.depth if self.depth_scaled else 1, self.budget), -math.inf))
                continue
            if self.depth_scaled:
                per_depth_N = self.cost.draft_depth_s(rows * w_N)  # an array (the fit) or a float (the mean)
                draft_DN = d_D1 * per_depth_N
            else:  # the whole draft or none: the deepest curve at the seconds of a draft of N nodes
                V_DN, draft_DN = V_DN[-1:], self.cost.proposer_draft_s(n_N)
            rate_CDN.append(np.where(V_DN < 0, -math.inf, (1 + V_DN) / np.maximum(draft_DN + fixed + verify_N, 1e-300)))
        return np.stack(rate_CDN)

    def choose(self, tree, active_B: torch.Tensor, rows: int):
        """The tree truncated to the chosen node count (choose_nodes; the draft is already paid).
        An ordinary step's choice must cost little: the tree comes to the host once, each node's
        acceptance key is computed once for the choice, the learning and the observation, and the
        seconds of every node count are weighed once per plan (`_plan_seconds`)."""
        from spec_core.decoding.tree import truncate

        scored, depth_BN = tree.score_BN is not None, _host(tree.depth_BN)
        real_BN = _host(tree.parent_BN) != np.arange(1, tree.size + 1)  # a pad is its own parent (`DraftTree.real_BN`)
        key_BN = self.acceptance.keys(_host(tree.score_BN) if scored else None, depth_BN)
        p_BN = self.acceptance.p_of(key_BN, scored) * real_BN
        active = _host(active_B).astype(bool)
        w = self.classes[self._class]
        narrowed = self.draft_width if w is not None and self.draft_width < w else None
        if w is None and self.draft_nodes is not None and self.draft_nodes < self.budget:
            narrowed = self.draft_nodes  # a proposer's bounded draft: its first nodes only
        k = self._exploring()
        self._drafted += 1
        self._drafted_nodes = tree.size  # per slot, for a proposer's draft seconds (observe)
        # learning from every tree made the policy ~5% of a batch-2 run on a CPU: every explored or
        # probing tree teaches, and one ordinary tree in learn_every (with the same memory in steps)
        learn = (k is not None or self._probe or not self.curves[-1].knows(self.depth)
                 or self._drafted % self.cfg.learn_every == 0)
        if learn:  # a scored tree's curves learn its nodes' buckets (weighed at plan time), a proposer's its p's
            drafted = self.depths[-1] if self.depths else self.depth
            if scored:
                x_BN = np.where(real_BN, key_BN, -1)
                self.curves[self._class].learn(x_BN, depth_BN, active, drafted, narrowed, self.cfg.learn_every, _BUCKETS)
            else:
                self.curves[self._class].learn(p_BN, depth_BN, active, drafted, narrowed, self.cfg.learn_every)
            self._planned = None  # the values moved: the plan is weighed again
        # a probe verifies as the full exploration (by the AR plan it would verify no node, and a
        # proposer's acceptance would never be taught again)
        if self.steps < self.cfg.calibrate:  # the calibrating chain: its one node
            n = min(1, tree.size)
        elif k is not None or self._probe or not self.cost.ready:
            n = min(self.explore[(k or 0) % len(self.explore)][0], tree.size)
            if self.cost.varied:  # no more nodes than could pay were every one accepted
                n = min(n, could_pay(depth_BN, real_BN, active, step_seconds(self.cost, rows, n)))
        elif self.rate is None:
            n, _ = choose_nodes(p_BN, active, rows, self.cost)
        else:  # tokens - rate x seconds, the seconds of this plan
            score_N = _value(p_BN, active) - self._plan_seconds(rows, int(active.sum()), tree.size)
            n = int(score_N.argmax())  # ties: the first, the smaller tree
        self.chosen.append(n)
        # what observe counts: the verified nodes' keys, real and active (a drafter's one tree in
        # learn_every, with the p's they were predicted at; a proposer's every tree)
        self._step = (key_BN[:, :n], real_BN[:, :n] & active[:, None], scored,
                      p_BN[:, :n] if learn else None) if learn or not self.depth_scaled else None
        return truncate(tree, n)

    def _plan_seconds(self, rows: int, n_active: int, n_max: int) -> np.ndarray:
        """(n_max + 1,) the planned rate x the seconds of a step verifying N = 0..n_max nodes
        (`step_seconds`), weighed once per plan and at most `replan_every` steps apart (an AR plan
        lasts until a probe): the cost fit moves little in so few steps, and each weighing cost ~0.1
        ms a step inside a batch-2 run on 2 cores, ~0.7% of it."""
        key = (self._plans, self.steps // self.cfg.replan_every, rows, n_active)
        if self._seconds[0] != key or len(self._seconds[1]) <= n_max:
            self._seconds = (key, self.rate * n_active * step_seconds(self.cost, rows, max(n_max, self.budget)))
        return self._seconds[1][: n_max + 1]

    def observe(self, tree, rows: int, verify_s: float, draft_s: float, draft_depth: int,
                path_BD: torch.Tensor, n_B: torch.Tensor, active_B: torch.Tensor, draft_width: int = 0,
                wall_s: float = 0.0) -> None:
        """A verified step: its costs (`draft_width`: the width the draft expanded per depth, 0
        where the policy does not plan it; `wall_s`: seconds since the previous step ended, the
        admissions' prefills between left out - 0 where not measured), and which of its real
        nodes the walk accepted."""
        if self.settled:  # AR for good: a step's bookkeeping costs what it must (AR's seconds as they were)
            self.steps += 1
            self.chosen.append(0)
            self.ar_time += self._settled_ar_s
            return
        exploring = self._exploring() is not None or self.steps < self.cfg.calibrate  # (calibrating counts as one)
        active = _host(active_B).astype(bool)
        n_active, t_ar = int(active.sum()), self.cost.ar_step_s(rows)
        ar_s = (n_active + int(_host(n_B)[active].sum())) * t_ar / max(n_active, 1)  # AR's seconds for its tokens
        self.ar_time += ar_s
        if exploring or self._probe:  # a learning step: what it took beyond AR's seconds
            self.learn_loss += (wall_s if wall_s > 0 else verify_s + draft_s) - ar_s
            self.explorations += exploring
            self.probes += self._probe and not exploring
        self._schedule(exploring, verify_s + draft_s)
        self.steps += 1
        if wall_s > 0:
            self.cost.observe_step(wall_s, verify_s, draft_s, tree.size > 0)
        if draft_depth == 0:
            self.chosen.append(0)
        self.cost.observe(rows * (1 + tree.size), verify_s)
        if tree.size == 0 and self._prev_ar:  # AR's seconds in a run of AR steps (`ar_probe_steps`)
            self.cost.observe_ar(rows, verify_s)
        self._prev_ar = tree.size == 0
        self.cost.observe_draft(draft_depth, draft_s, rows * draft_width)
        if draft_depth and not self.depth_scaled:
            self.cost.observe_proposer_draft(self._drafted_nodes, draft_s)
        # a proposer's acceptance per node index rests on few nodes: it counts every drafted step
        # (a drafter's, keyed by confidence, one in learn_every as its values)
        step, self._step = self._step, None
        if tree.size == 0 or step is None:
            return
        key_BN, real_BN, scored, p_BN = step
        # node i (1-based) of row b is accepted iff it is among the first n[b] entries of its path
        path, n = _host(path_BD), _host(n_B)
        on_path_BD = (np.arange(path.shape[1])[None] < n[:, None]) & (path > 0)
        accepted_BM = np.zeros((real_BN.shape[0], tree.size + 1), dtype=bool)
        b_I, d_I = np.nonzero(on_path_BD)
        accepted_BM[b_I, path[b_I, d_I]] = True
        accepted_BN = accepted_BM[:, 1: real_BN.shape[1] + 1]  # a compiled step's pads past the chosen nodes
        if p_BN is not None:
            self.predicted += float(p_BN[real_BN].sum())
            self.accepted += float(accepted_BN[real_BN].sum())
            self.tried_rows += int(real_BN.any(1).sum())
        self.acceptance.observe_keys(key_BN, scored, real_BN, accepted_BN)

    def _schedule(self, explored: bool, seconds: float) -> None:
        """After a step: the ordinary steps' cost, and when the next re-exploration is due - at
        least `reexplore` steps after this one, and as many as make its extra cost (over an ordinary
        step) `explore_share` of the steps between."""
        if not explored:
            self.step_s = seconds if self.step_s == 0 else 0.9 * self.step_s + 0.1 * seconds
        elif self.steps >= self._initial:
            extra = max(seconds - self.step_s, 0.0)
            gap = math.ceil(extra / (self.cfg.explore_share * self.step_s)) if self.step_s > 0 else 0
            self._next_explore, self._due = self.steps + max(self.cfg.reexplore, gap), None
        if self._due is None and self.steps + 1 >= self._next_explore:
            self._due, self._cycle = self._cycle % len(self.explore), self._cycle + 1

    # the stats that add up over runs (a report sums them over shards; the rest are the latest's)
    ADDITIVE = ("steps", "nodes", "depth", "predicted_accepted", "observed_accepted", "ar_steps", "explorations",
                "probes", "learning_loss_s", "ar_equivalent_s")

    def stats(self) -> dict:
        """What the reports show: nodes and draft depth per step, the steps that were AR, explorations
        and probes and what learning lost to AR (s; < 0: it gained), the cost fit, the calibration."""
        a, b = self.cost.coefficients()
        return {"steps": self.steps, "nodes": sum(self.chosen), "depth": sum(self.depths),  # additive
                "predicted_accepted": self.predicted, "observed_accepted": self.accepted,
                "ar_steps": self.depths.count(0), "explorations": self.explorations, "probes": self.probes,
                "learning_loss_s": self.learn_loss, "ar_equivalent_s": self.ar_time,
                "verify_ms_intercept": 1e3 * a, "verify_ms_per_token": 1e3 * b,  # the current line
                "draft_ms_per_depth": 1e3 * self.cost.draft_per_depth,
                "commit_extra_ms": 1e3 * self.cost.commit_extra(), "step_overhead_ms": 1e3 * self.cost.overhead_s()}
