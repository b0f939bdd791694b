"""spec_core.decoding.goodput: the chooser on synthetic costs (free verification -> the full tree,
expensive -> AR, the cap), the cost fit against a known line, acceptance calibration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from spec_core.decoding.goodput import (AcceptanceModel, CostModel, GoodputConfig, GoodputPolicy, LineFit, _host,
                                       choose_nodes, could_pay, prior_curves, step_seconds)

from spec_core.targets.saved import save_acceptance

CALIBRATE = GoodputConfig().calibrate


def _calibrated(pol: GoodputPolicy) -> GoodputPolicy:
    """A policy past its calibrating steps (a one-node chain, an AR step), driven by hand below,
    whose explorations may all run (the learning budget and `may_pay` set aside until `_bounded`)."""
    pol.steps = CALIBRATE
    pol.cfg.learn_allowance, pol.may_pay = 1e9, lambda rows: True
    return pol


def _bounded(pol: GoodputPolicy) -> GoodputPolicy:
    """`_calibrated`'s policy with its learning bounded again."""
    pol.cfg.learn_allowance = GoodputConfig().learn_allowance
    del pol.may_pay
    return pol


def _cost(a: float, b: float) -> CostModel:
    cm = CostModel()
    for t in (4, 8, 16, 32, 64):
        cm.observe(t, a + b * t)
    return cm


P = torch.tensor([[0.9, 0.8, 0.6, 0.3, 0.1, 0.05], [0.7, 0.5, 0.5, 0.2, 0.0, 0.0]], dtype=torch.float64)
ACTIVE = torch.tensor([True, True])


def test_cost_fit_recovers_a_line_and_forgets_the_past():
    a, b = _cost(0.01, 0.002).coefficients()
    assert a == pytest.approx(0.01) and b == pytest.approx(0.002)
    cm = _cost(0.01, 0.002)
    for _ in range(400):  # the hardware changed (a slower machine): the fit follows
        for t in (4, 16, 64):
            cm.observe(t, 0.02 + 0.004 * t)
    a, b = cm.coefficients()
    assert a == pytest.approx(0.02, rel=0.02) and b == pytest.approx(0.004, rel=0.02)
    flat = CostModel()
    flat.observe(8, 0.05)
    flat.observe(8, 0.07)
    assert flat.coefficients() == pytest.approx((0.06, 0.0), abs=1e-3)  # no variation in T: a flat line
    assert not CostModel().ready and flat.ready


def _bounded_least_squares(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The oracle: min sum (a + b x - y)^2 over a, b >= 0, from the free fit and both boundaries."""
    def sse(a: float, b: float) -> float:
        return float(((a + b * x - y) ** 2).sum())

    b_free, a_free = np.polyfit(x, y, 1)
    feasible = [(a_free, b_free)] if a_free >= 0 and b_free >= 0 else []
    feasible += [(0.0, max(float((x * y).sum() / (x * x).sum()), 0.0)), (max(float(y.mean()), 0.0), 0.0)]
    return min(feasible, key=lambda ab: sse(*ab))


@pytest.mark.parametrize("seconds", [
    lambda x: 0.004 + 0.0002 * x,              # a line: the free fit
    lambda x: 1e-5 * x ** 2,                   # convex: the free intercept is negative
    lambda x: 0.05 - 0.0001 * x,               # falling: the free slope is negative
    lambda x: 2.44e-3 * x * (1 + 0.02 * np.sin(x)),  # near a line through the origin
])
def test_cost_fit_is_the_bounded_least_squares_line(seconds):
    x = np.array([16.0, 16, 16, 32, 64, 96, 144, 144])
    fit = LineFit(decay=1.0)
    for xi in x:
        fit.observe(float(xi), float(seconds(xi)))
    a, b = fit.coefficients()
    oracle = _bounded_least_squares(x, seconds(x))
    assert (a, b) == pytest.approx(oracle, rel=1e-6, abs=1e-12)
    assert a >= 0 and b >= 0


def test_free_verification_takes_the_full_tree():
    n, _ = choose_nodes(P, ACTIVE, rows=2, cost=_cost(0.01, 0.0))
    assert n == P.shape[1]


def test_expensive_verification_takes_ar():
    n, rates = choose_nodes(P, ACTIVE, rows=2, cost=_cost(0.001, 0.01))
    assert n == 0 and rates[0] == max(rates)


def test_the_choice_is_the_brute_force_optimum():
    for a, b, draft in itertools.product((0.002, 0.01, 0.05), (0.0, 0.0005, 0.002, 0.01), (0.0, 0.005)):
        cm = _cost(a, b)
        n, _ = choose_nodes(P, ACTIVE, rows=2, cost=cm, draft_s=draft)
        brute = [(2 + float(P[:, :k].sum())) / ((draft if k else 0) + a + b * 2 * (1 + k)) for k in range(7)]
        assert brute[n] == pytest.approx(max(brute)), (a, b, draft)


def test_committing_a_tree_costs_what_it_measured_beyond_an_ar_commit():
    cm = _cost(0.01, 0.0)  # verification free per token: the full tree, while commits cost alike
    assert cm.commit_extra() == 0.0
    cm.observe_commit(True, 0.004)
    assert cm.commit_extra() == 0.0  # only one side measured yet
    for _ in range(50):
        cm.observe_commit(True, 0.030)   # feeding the accepted tokens to a drafter as costly as the target
        cm.observe_commit(False, 0.001)  # an AR step: the drafter waits
    assert cm.commit_extra() == pytest.approx(0.029, rel=1e-3)
    n, rates = choose_nodes(P, ACTIVE, rows=2, cost=cm)
    brute = [(2 + float(P[:, :k].sum())) / (0.01 + (0.029 if k else 0.0)) for k in range(7)]
    assert n == 0 and rates == pytest.approx(brute, rel=1e-3)  # (2 + 3.65) / 0.039 < 2 / 0.01


def test_never_more_than_the_cap_and_inactive_rows_count_nothing():
    n, rates = choose_nodes(P, ACTIVE, rows=2, cost=_cost(0.01, 0.0), cap=3)
    assert n == 3 and len(rates) == 4
    only_second, _ = choose_nodes(P, torch.tensor([False, True]), rows=2, cost=_cost(0.01, 0.0008))
    both, _ = choose_nodes(P, ACTIVE, rows=2, cost=_cost(0.01, 0.0008))
    assert only_second <= both  # the first row's confident nodes no longer pay for the step


def test_acceptance_calibrates_to_what_is_observed():
    acc = AcceptanceModel()
    score = torch.log(torch.full((1, 4), 0.95, dtype=torch.float64))  # the drafter is 95% sure
    depth = torch.ones(1, 4, dtype=torch.long)
    assert acc.predict(score, depth)[0, 0] == pytest.approx(0.95)  # the prior: its own confidence
    real = torch.ones(1, 4, dtype=torch.bool)
    for _ in range(200):  # but only 1 in 4 is accepted
        acc.observe(score, depth, real, torch.tensor([[True, False, False, False]]))
    assert acc.predict(score, depth)[0, 0] == pytest.approx(0.25, abs=0.02)
    # proposers: by depth, non-increasing along a row
    d = torch.tensor([[1, 2, 3, 1]])
    for _ in range(100):
        acc.observe(None, d, real, torch.tensor([[True, True, False, False]]))
    p = acc.predict(None, d)[0].tolist()
    assert p[0] == pytest.approx(0.5, abs=0.05) and p[1] <= p[0] and p[3] <= p[2]


def _confident_tree():
    """Six nodes over depths 1-3 (the 6th's depth 4 clamped to 3), confident ones first."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    parent = torch.tensor([[0, 1, 2, 0, 4, 3]])
    depth = torch.tensor([[1, 2, 3, 1, 2, 4]]).clamp_max(3)
    score = torch.log(torch.tensor([[0.95, 0.9, 0.85, 0.3, 0.2, 0.1]], dtype=torch.float64))
    return DraftTree(torch.zeros(1, 6, dtype=torch.long), parent, depth, ancestor_mask(parent, 3), score)


def _trained_policy(a: float, b: float, per_depth: float, width: int | None = None) -> GoodputPolicy:
    """A policy past its exploration, whose value curves come from a tree of confident nodes."""
    pol = GoodputPolicy(budget=6, depth=3, width=width)
    pol.cost = _cost(a, b)
    pol.cost.draft_per_depth = per_depth
    _calibrated(pol)
    for _ in range(len(pol.explore)):
        pol.plan(1, 1)
        pol.choose(_confident_tree(), torch.tensor([True]), 1)
        pol.steps += 1
    _bounded(pol)
    return pol


def test_plan_drafts_deep_when_drafts_are_cheap_and_not_at_all_when_they_cost_too_much():
    assert _trained_policy(0.01, 0.0001, per_depth=0.0001).plan(1, 1) == 3
    pol = _trained_policy(0.01, 0.0001, per_depth=1.0)  # a draft costs 100 verifications
    assert pol.plan(1, 1) == 0 and not pol.may_pay(1)
    assert [pol.plan(1, 1) for _ in range(200)] == [0] * 200  # no acceptance could pay: no probe either
    pol = _doubtful_policy()  # drafts could pay, but its nodes are seldom accepted
    plans = [pol.plan(1, 1) for _ in range(12)]
    assert plans.count(0) >= 8 and 3 in plans  # AR, with full-depth probes ever further apart


def _doubtful_policy() -> GoodputPolicy:
    """A policy past its exploration whose curves come from unconfident trees: AR is planned, but
    drafting could pay were its nodes accepted (a draft depth costs 1% of a verification; a
    verify of 7 tokens two AR steps)."""
    pol = GoodputPolicy(budget=6, depth=3)
    pol.cost = _cost(0.01, 0.002)
    pol.cost.draft_per_depth = 0.0001
    tree = _confident_tree()
    tree.score_BN = torch.log(torch.full((1, 6), 0.05, dtype=torch.float64))
    _calibrated(pol)
    for _ in range(len(pol.explore)):
        pol.plan(1, 1)
        pol.choose(tree, torch.tensor([True]), 1)
        pol.steps += 1
    _bounded(pol)
    assert pol.plan(1, 1) == 0 and pol.may_pay(1)
    return pol


def test_plan_is_the_brute_force_best_depth_and_shallower_as_drafting_costs_more():
    depths = []
    for per_depth in (0.0001, 0.002, 0.004, 0.01, 0.03, 1.0):
        pol = _trained_policy(0.01, 0.0001, per_depth)
        rates = {(0, 0): 1 / pol.cost.verify_s(1)}
        for d in (1, 2, 3):
            for n in range(1, 7):
                rates[(d, n)] = (1 + pol.value[d][n]) / (d * per_depth + pol.cost.verify_s(1 + n))
        best = max(rates, key=rates.get)
        depths.append(pol.plan(1, 1))
        assert depths[-1] == best[0], per_depth
    assert depths == sorted(depths, reverse=True) and depths[0] == 3 and depths[-1] == 0


def test_a_proposer_chain_deeper_than_the_tree_depth_counts_in_the_deepest_curve():
    """Training-free proposers draft chains of their own length (PLD: 10 tokens) whatever the tree
    config's depth: their nodes past it belong to the deepest value curve."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    pol = GoodputPolicy(budget=10, depth=3)
    parent = torch.arange(10)[None]  # a chain: node i's parent is node i - 1 (0: the root)
    depth = torch.arange(1, 11)[None]
    tree = DraftTree(torch.zeros(1, 10, dtype=torch.long), parent, depth, ancestor_mask(parent, 10), None)
    pol.choose(tree, torch.tensor([True]), 1)
    p = pol.acceptance.predict(None, depth)[0].tolist()
    assert pol.value[3][10] == pytest.approx(sum(p)) and pol.value[1][10] == pytest.approx(p[0])


def test_probes_where_no_draft_pays_cost_a_bounded_share_of_ar_time():
    """A full-depth probe that costs 2 AR steps is run at most every probe / (2% of an AR step)
    steps once the pause has doubled that far: over 4,000 AR steps the probes' cost stays below
    what the doubling from 1 to that limit spends, and never more often than max_pause allows."""
    pol = _doubtful_policy()
    ar = pol.cost.verify_s(1)
    probe = 3 * 0.0001 + pol.cost.commit_extra() + pol.cost.verify_s(1 + pol.budget)
    assert pol.pause_limit(1) == pytest.approx(probe / (0.02 * ar), rel=1e-3, abs=1) and pol.pause_limit(1) > 64
    plans = [pol.plan(1, 1) for _ in range(4000)]
    probes = [i for i, d in enumerate(plans) if d]
    limit = pol.pause_limit(1)  # the pause doubles up to it (1, 2, 4, ...), then stays
    assert 0 < len(probes) <= math.log2(limit) + 2 + 4000 / limit
    assert all(b - a >= 64 for a, b in zip(probes[6:], probes[7:]))  # pauses past max_pause's 64
    cheap = _trained_policy(0.01, 0.0001, per_depth=1e-6)
    assert cheap.pause_limit(1) == cheap.cfg.max_pause  # a cheap probe: the usual 64


def _paths(tree, b: int) -> set[tuple[int, ...]]:
    """Row b's nodes as token paths from the root (a node's identity, whatever its index)."""
    tok = tree.tokens_BN[b].tolist()
    real = tree.real_BN[b].tolist()
    return {tuple(t for t, on in zip(tok, tree.anc_BMM[b, i].tolist()) if on) for i in range(tree.size) if real[i]}


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_a_tree_narrowed_to_width_n_holds_the_full_trees_best_n_nodes(tiny_world, n):
    """The ground of the policy's narrowing: an EAGLE-2 tree that expands the best n nodes per depth
    (width n) holds exactly the n best nodes of the full-width tree, so drafting it loses nothing."""
    import dataclasses

    from spec_core.decoding import DecodeEngine, Request, TreeConfig
    from spec_core.decoding.tree import truncate
    from tests.spec_core.decoding.conftest import prompt_inputs

    adapter, processor, drafter, evals, _ = tiny_world
    engine = DecodeEngine(adapter, drafter, batch_size=3, capacity=512, tree=TreeConfig(6, 5, 40))
    list(engine._admit([(b, Request(prompt_inputs(processor, s), 8, key=b)) for b, s in enumerate(evals[::7][:3])]))
    active = [True] * 3
    full = truncate(engine._draft(active, [False] * 3), n)
    engine.tree_cfg = dataclasses.replace(engine.tree_cfg, width=n)
    narrow = engine._draft(active, [False] * 3)
    assert narrow.size < 40 or n >= 5  # the narrowed draft is smaller, not the same tree
    narrow = truncate(narrow, n)
    for b in range(3):
        assert _paths(narrow, b) == _paths(full, b) and len(_paths(full, b)) == n, b


def test_plan_narrows_the_draft_to_the_nodes_it_expects_and_a_narrowed_tree_teaches_only_those():
    pol = _trained_policy(0.01, 0.0001, per_depth=0.0001, width=6)
    d = pol.plan(1, 1)
    n = pol._best_plan(1, 1)[1]
    w = pol.classes[pol._class]
    assert d == 3 and pol.draft_width == min(w, n) and pol.widths[-1] == pol.draft_width
    before = {dd: list(v) for dd, v in enumerate(pol.value) if v is not None}
    pol._class = len(pol.classes) - 1  # a full-width plan's tree ...
    pol.draft_width, pol.cfg.learn_every = 2, 1  # ... drafted 2 wide: its 3rd..6th best nodes are not the full tree's
    tree = _confident_tree()
    tree.score_BN = tree.score_BN - 1.0  # less confident than the trees the curves were learnt on
    pol.choose(tree, torch.tensor([True]), 1)
    assert all(pol.value[dd][3:] == v[3:] for dd, v in before.items())
    assert any(pol.value[dd][1:3] != v[1:3] for dd, v in before.items())


def test_a_proposer_drafts_its_whole_tree_or_none_at_its_measured_cost():
    """A proposer builds its whole tree whatever the depth planned: its plan is the full depth or
    AR, weighed at what a whole draft measured (not a depth's share of it)."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    parent = torch.tensor([[0, 1, 2]])  # a chain of three, accepted by the depth prior 0.5 ** d
    chain = DraftTree(torch.zeros(1, 3, dtype=torch.long), parent, torch.tensor([[1, 2, 3]]),
                      ancestor_mask(parent, 3), None)

    def proposer_policy(draft_s: float) -> GoodputPolicy:
        pol = GoodputPolicy(budget=3, depth=3, depth_scaled=False)
        pol.cost = _cost(0.01, 0.0001)
        _calibrated(pol)
        for _ in range(len(pol.explore)):
            pol.plan(1, 1)
            pol.choose(chain, torch.tensor([True]), 1)
            pol.cost.observe_draft(3, draft_s)
            pol.steps += 1
        _bounded(pol)
        return pol

    ar_rate = 1 / 0.0101
    assert proposer_policy(0.001).plan(1, 1) == 3  # a cheap whole draft pays
    cheap = proposer_policy(0.001)  # ... and is drafted only as large as the plan may verify
    assert cheap.plan(1, 1) == 3 and cheap.draft_nodes == cheap._best_plan(1, 1)[1] >= 1
    fresh = GoodputPolicy(budget=3, depth=3, depth_scaled=False)
    assert fresh.plan(1, 1) == 1 and fresh.draft_nodes == 1  # calibrating: a one-node draft
    fresh = _calibrated(GoodputPolicy(budget=3, depth=3, depth_scaled=False))
    assert fresh.plan(1, 1) == 3 and fresh.draft_nodes == 3  # the first exploration drafts the budget
    costly = proposer_policy(0.012)
    assert costly.cost.draft_step == pytest.approx(0.012)
    # a depth's share of the draft (0.004 s) would pay at depth 1: (1 + 0.5) / (0.004 + 0.0102 s)
    assert (1 + costly.value[1][1]) / (0.004 + costly.cost.verify_s(2)) > ar_rate
    # the whole draft does not, at any node count: (1 + 0.875) / (0.012 + 0.0104 s) at best
    assert max((1 + costly.value[3][n]) / (0.012 + costly.cost.verify_s(1 + n)) for n in (1, 2, 3)) < ar_rate
    assert costly.plan(1, 1) == 0
    assert {proposer_policy(0.008).plan(1, 1) for _ in range(5)} <= {0, 3}


def _chain(n: int):
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    parent = torch.arange(n)[None]  # node i's parent is node i - 1 (0: the root)
    return DraftTree(torch.zeros(1, n, dtype=torch.long), parent, torch.arange(1, n + 1)[None],
                     ancestor_mask(parent, n), None)


def test_a_probe_verifies_what_could_pay_and_teaches_a_proposers_acceptance():
    """Where AR is planned, a probe drafts the whole tree and verifies as the full exploration
    does (no more nodes than could pay), not the none its AR plan would choose: a proposer learns
    its acceptance from verified nodes only, so a first estimate that said AR would never move."""
    pol = GoodputPolicy(budget=4, depth=4, depth_scaled=False)
    pol.cost = _cost(0.01, 0.0001)
    pol.acceptance.depth_acc[:] = 0.0  # every node looked hopeless so far
    pol.cost.observe_draft(4, 0.001)
    _calibrated(pol)
    for _ in range(len(pol.explore)):
        pol.plan(1, 1)
        pol.choose(_chain(4), torch.tensor([True]), 1)
        pol.steps += 1
    _bounded(pol)
    assert pol._best_plan(1, 1) == (0, 0)
    seen = pol.acceptance.node_seen.copy()
    for _ in range(200):
        if pol.plan(1, 1):
            break
    assert pol._probe and pol.draft_nodes is None  # a probe drafts the budget
    chosen = pol.choose(_chain(4), torch.tensor([True]), 1)
    assert chosen.size == 4  # a chain of 4 at verify(5) < 5 verify(1) could pay: all of it
    pol.observe(chosen, 1, 0.011, 0.001, 4, torch.tensor([[1, 2, 3, 4]]), torch.tensor([4]), torch.tensor([True]))
    assert (pol.acceptance.node_seen - seen).tolist() == [1, 1, 1, 1]
    assert pol.acceptance.node_acc.tolist() == [1, 1, 1, 1]


def test_a_proposers_draft_seconds_are_a_line_in_the_nodes_it_drafts():
    """Explorations bound a proposer's draft at the nodes they verify (one where they verify none),
    every draft is measured at the nodes it built, and the plan weighs N nodes at the line's value
    at N: a whole 80-node draft's 1 ms is no price of a 1-node draft's 0.1 ms (measured on 2 cores,
    that mean kept Token Recycling on AR at batch 4 where one node per step ran 6% faster)."""
    from spec_core.decoding.tree import empty_tree

    pol = GoodputPolicy(budget=8, depth=8, depth_scaled=False)
    assert [e[0] for e in pol.explore] == [8, 4, 2]
    bounds = []
    for _ in range(CALIBRATE + 3):  # the calibrating one-node draft and AR step, then the explorations
        d = pol.plan(1, 1)
        bounds.append(pol.draft_nodes if d else 0)
        tree = pol.choose(_chain(pol.draft_nodes), torch.tensor([True]), 1) if d else empty_tree(1, "cpu")
        n = tree.size
        pol.observe(tree, 1, 0.01 + 0.001 * n, 0.0001 + 0.0001 * pol.draft_nodes if d else 0.0, 8 if d else 0,
                    torch.tensor([list(range(1, n + 1))]) if n else torch.zeros(1, 0, dtype=torch.long),
                    torch.tensor([n]), torch.tensor([True]))
    assert bounds == [1, 0, 8, 4, 2]
    assert pol.cost.proposer_draft_s(np.array([1.0, 8.0])) == pytest.approx([0.0002, 0.0009])
    assert pol.cost.proposer_draft_s(1) < pol.cost.draft_step  # the mean of all drafts: 0.00045 s
    fresh = CostModel()
    fresh.observe_draft(3, 0.002)
    assert fresh.proposer_draft_s(5) == 0.002  # sizes not varied yet: the mean of whole drafts


def test_could_pay_is_the_most_nodes_whose_step_beats_ar_were_every_node_accepted():
    """Brute force over N: all accepted, the step commits 1 + the deepest real node's depth among
    the first N of the rows (the best row), in seconds_N against one token in seconds_0."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        B, N = int(rng.integers(1, 4)), int(rng.integers(0, 12))
        depth_BN = np.sort(rng.integers(1, 6, size=(B, N)), axis=1)
        real_BN = rng.random((B, N)) < 0.8
        active_B = rng.random(B) < 0.8
        seconds_N = 0.01 * (1 + np.arange(N + 1) * rng.uniform(0.05, 1.0))
        got = could_pay(depth_BN, real_BN, active_B, seconds_N)
        best = 0
        for n in range(1, N + 1):
            deepest = max((int(depth_BN[b, :n][real_BN[b, :n]].max(initial=0)) for b in range(B) if active_B[b]),
                          default=0)
            if deepest and (1 + deepest) * seconds_N[0] >= seconds_N[n]:
                best = n
        assert got == best, (depth_BN, real_BN, active_B, seconds_N)


def test_an_exploration_verifies_no_more_nodes_than_could_pay():
    """40 candidates for the next token (a star): every step commits 2 tokens at best, so N nodes
    could pay only while verify(1 + N) <= 2 verify(1): with verify(T) = 0.01 + b T, N <= 0.01 / b + 1
    (the whole budget at b = 0.0001, 10 at 0.0011, 1 at 0.02); a chain of 40 could pay at any N."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    def tree(parent):
        depth = torch.ones(1, 40, dtype=torch.long) if parent.max() == 0 else torch.arange(1, 41)[None]
        return DraftTree(torch.zeros(1, 40, dtype=torch.long), parent, depth, ancestor_mask(parent, 40), None)

    star, chain = tree(torch.zeros(1, 40, dtype=torch.long)), tree(torch.arange(40)[None])
    for shape, b, most in ((star, 0.0001, 40), (star, 0.0011, 10), (star, 0.02, 1), (chain, 0.02, 40)):
        pol = _calibrated(GoodputPolicy(budget=40, depth=40, depth_scaled=False))
        pol.cost = _cost(0.01, b)
        assert pol.plan(1, 1) == 40 and pol._exploring() == 0  # the first exploration: the whole budget
        assert pol.choose(shape, torch.tensor([True]), 1).size == most, (b, most)


@pytest.mark.parametrize("explore_cost, most", [(0.010, 1000 // 32 + 1), (0.100, 1000 // 450 + 1)])
def test_re_explorations_cost_a_bounded_share_of_the_steps_between(explore_cost, most):
    """Every `reexplore` steps while an exploration costs what an ordinary step does; where one
    costs 10x (a full tree at a large batch), far enough apart that they add at most 2%."""
    pol = _trained_policy(0.01, 0.0001, per_depth=0.0001)
    from spec_core.decoding.tree import empty_tree

    explored, empty = [], torch.zeros(1, 0, dtype=torch.long)
    for _ in range(1000):
        k = pol._exploring()
        explored.append(k is not None)
        pol.observe(empty_tree(1, torch.device("cpu")), 1, explore_cost if k is not None else 0.010, 0.0, 0, empty,
                    torch.zeros(1, dtype=torch.long), torch.tensor([True]))
    steps = [i for i, e in enumerate(explored) if e]
    assert 2 <= len(steps) <= most
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert min(gaps) >= 32
    extra = (explore_cost - 0.010) * len(steps)
    assert extra <= 0.02 * 0.010 * (steps[-1] - steps[0] + max(gaps)) + 1e-9


def test_a_deeper_curve_is_its_shallower_one_plus_the_gain_measured_on_the_same_trees():
    """Deep drafts are rarer and come from other states than shallow ones: learnt apart, a deep
    curve could fall below a shallow one (a depth-2 tree holds every candidate of a depth-1 tree).
    Each depth's gain is measured on the trees drafted that deep, against their own shallower part."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    def chain(first: float, second: float) -> DraftTree:  # node 1 at depth 1, node 2 its child
        parent = torch.tensor([[0, 1]])
        score = torch.log(torch.tensor([[first, second]], dtype=torch.float64))
        return DraftTree(torch.zeros(1, 2, dtype=torch.long), parent, torch.tensor([[1, 2]]),
                         ancestor_mask(parent, 2), score)

    pol = GoodputPolicy(budget=2, depth=2)
    active = torch.tensor([True])
    for step in range(200):  # shallow drafts in confident states, a rare deep one in a doubtful state
        deep = step % 10 == 0
        pol.depths.append(2 if deep else 1)
        pol.choose(chain(0.35, 0.25) if deep else chain(0.95, 0.9), active, 1)
    p = pol.acceptance.predict  # the prior: a node is accepted as often as its bucket says
    v1, v2 = pol.value[1], pol.value[2]
    assert v2[1] >= v1[1] and v2[2] >= v1[2]
    gain = float(p(torch.log(torch.tensor([[0.25]], dtype=torch.float64)), torch.tensor([[2]]))[0, 0])
    assert v2[2] - v1[2] == pytest.approx(gain, rel=1e-6)  # the deep trees' own second node
    assert v1[1] == pytest.approx(0.95, abs=0.05)  # the confident states' first node, as they are most


def test_ordinary_steps_teach_one_tree_in_learn_every_explorations_every_one():
    pol = _trained_policy(0.01, 0.0001, per_depth=0.0001)
    tree = _confident_tree()
    tree.score_BN = tree.score_BN - 1.0  # other trees than the curves were learnt on: every lesson moves them
    moved = []
    for _ in range(8):
        before = [list(v) for v in pol.value[1:]]
        pol.plan(1, 1)
        pol.choose(tree, torch.tensor([True]), 1)
        moved.append([list(v) for v in pol.value[1:]] != before)
        pol.steps += 1
    assert sum(moved) == 8 // pol.cfg.learn_every
    pol._due = 0  # a re-exploration: it always teaches
    before = [list(v) for v in pol.value[1:]]
    pol.choose(tree, torch.tensor([True]), 1)
    assert [list(v) for v in pol.value[1:]] != before


def test_with_a_long_run_rate_a_paid_draft_verifies_every_node_worth_its_time():
    """Once the draft is paid, N maximises tokens - rate x seconds (brute force); below the step's
    own ratio (which leaves the paid draft out) that verifies at least as many nodes."""
    for a, b, lam in itertools.product((0.002, 0.01), (0.0005, 0.002, 0.01), (50.0, 150.0, 400.0)):
        cm = _cost(a, b)
        n, _ = choose_nodes(P, ACTIVE, rows=2, cost=cm, rate=lam)
        brute = [2 + float(P[:, :k].sum()) - lam * (a + b * 2 * (1 + k)) for k in range(7)]
        assert brute[n] == pytest.approx(max(brute)), (a, b, lam)
        ratio_n, rates = choose_nodes(P, ACTIVE, rows=2, cost=cm)
        if lam <= max(rates):
            assert n >= ratio_n, (a, b, lam)


def test_proposer_acceptance_is_learnt_per_node_index():
    """A template's nodes of one depth differ: index 0 accepted 60% of the time, indices 1-3
    (its depth-1 siblings) 10%. Per index the model learns both (the depth's mean, 0.225, would
    undervalue the first node and overvalue the others); without `max_nodes` it keeps the depth's."""
    g = torch.Generator().manual_seed(0)
    rate_N = torch.tensor([0.6, 0.1, 0.1, 0.1])
    depth_BN = torch.ones(400, 4, dtype=torch.long)
    accepted_BN = torch.rand(400, 4, generator=g) < rate_N
    real_BN = torch.ones(400, 4, dtype=torch.bool)
    by_index, by_depth = AcceptanceModel(max_nodes=8), AcceptanceModel()
    for m in (by_index, by_depth):
        m.observe(None, depth_BN, real_BN, accepted_BN)
    p_index = by_index.predict(None, depth_BN[:1])[0]
    p_depth = by_depth.predict(None, depth_BN[:1])[0]
    assert np.allclose(p_index, rate_N.double().numpy(), atol=0.06)
    assert np.allclose(p_depth, 0.225, atol=0.04)
    assert GoodputPolicy(8, 3, depth_scaled=False).acceptance.node_seen.size == 8
    assert GoodputPolicy(8, 3).acceptance.node_seen.size == 0


def test_an_ar_step_measured_below_the_trees_line_costs_what_it_measured():
    """Tree steps pay fixed costs an AR step does not (mask, walk, learning from every node): a line
    fitted on them puts AR at 11 ms where it measured 4. The chooser weighs AR at its measured
    seconds (oracle: the brute-force rates with 4 ms at N = 0); measured above the line (the line
    missing the curve at few tokens, which small trees share), AR keeps the line."""
    cm = _cost(0.010, 0.0005)
    line = [(2 + float(P[:, :k].sum())) / (0.010 + 0.0005 * 2 * (1 + k)) for k in range(7)]
    assert choose_nodes(P, ACTIVE, rows=2, cost=cm)[1] == pytest.approx(line)
    for _ in range(30):
        cm.observe_ar(2, 0.004)
    assert cm.ar_s(2) == pytest.approx(0.004) and cm.ar_s(4) == pytest.approx(0.012)  # per row count
    n, rates = choose_nodes(P, ACTIVE, rows=2, cost=cm)
    assert rates == pytest.approx([2 / 0.004] + line[1:])
    assert n == 0 and line[0] < max(line)   # the line alone would have drafted
    policy = GoodputPolicy(6, 3, depth_scaled=False)
    policy.cost = cm
    policy.cost.draft_step = 1e-4
    V_KM = np.array([[0.0] * 7] * 2 + [[0.0] + P.sum(0).cumsum(0).div(2).tolist()])
    policy.curves[-1]._V_KMK, policy.curves[-1]._known = V_KM[..., None], 3  # a proposer's curves: p's
    assert policy._best_plan(2, 2) == (0, 0)
    for _ in range(30):
        cm.observe_ar(2, 0.030)
    assert cm.ar_s(2) == pytest.approx(0.011)  # above the line: the line
    assert policy._best_plan(2, 2)[0] == 3


def test_what_every_step_pays_is_measured_and_makes_larger_trees_worth_their_time():
    """A step's wall seconds beyond its draft, verify and commit extra (bookkeeping, the AR part of
    a commit) are the same whatever the plan; a rate that leaves them out prefers small trees. With
    them, the plan is the brute-force best rate counting them (oracle), and it drafts more nodes as
    they grow."""
    cm = CostModel()
    for wall, verify, draft in ((0.020, 0.010, 0.004), (0.021, 0.011, 0.004)):
        cm.observe_step(wall, verify, draft, verified_nodes=True)
    assert cm.overhead_s() == pytest.approx(0.9 * 0.006 + 0.1 * 0.006)
    cm.observe_step(0.001, 0.004, 0.0, verified_nodes=False)  # clock noise: never below 0
    assert cm.overhead_s() == pytest.approx(0.9 * 0.006)
    chosen = []
    for other in (0.0, 0.002, 0.01, 0.05):
        pol = _trained_policy(0.001, 0.0004, per_depth=0.0002)
        pol.cost.overhead = other
        rates = {(0, 0): 1 / (other + pol.cost.ar_s(1))}
        for d in (1, 2, 3):
            for k in range(1, 7):
                rates[(d, k)] = (1 + pol.value[d][k]) / (other + d * 0.0002 + pol.cost.verify_s(1 + k))
        best = max(rates, key=rates.get)
        assert pol._best_plan(1, 1) == best, other
        n, _ = choose_nodes(_confident_tree().score_BN.exp(), torch.tensor([True]), 1, pol.cost)
        chosen.append((best[1], n))
    assert [c[0] for c in chosen] == sorted(c[0] for c in chosen) and chosen[0][0] < chosen[-1][0], chosen
    assert [c[1] for c in chosen] == sorted(c[1] for c in chosen) and chosen[0][1] < chosen[-1][1], chosen


def test_the_engine_gives_each_step_its_wall_seconds_without_the_admissions_prefills(tiny_world):
    """Each step's wall seconds hold its draft and verify; with the prefills they add up to no more
    than the whole run (what lies outside: the end of the last step's bookkeeping); the overhead
    every step pays is measured from them."""
    import time

    from spec_core.decoding import DecodeEngine, Request, TreeConfig
    from tests.spec_core.decoding.conftest import prompt_inputs

    adapter, processor, drafter, evals, _ = tiny_world
    engine = DecodeEngine(adapter, drafter, batch_size=2, capacity=512, tree=TreeConfig(3, 3, 8, policy="goodput"))
    seen = []
    observe = engine.policy.observe

    def spy(tree, rows, verify_s, draft_s, *args):
        seen.append((args[-1], verify_s, draft_s))
        return observe(tree, rows, verify_s, draft_s, *args)

    engine.policy.observe = spy
    requests = [Request(prompt_inputs(processor, s), 12, key=i) for i, s in enumerate(evals[::5][:5])]
    t0 = time.perf_counter()
    assert len(list(engine.generate(requests))) == 5
    elapsed = time.perf_counter() - t0
    assert seen and all(wall >= verify + draft > 0 for wall, verify, draft in seen)
    assert sum(w for w, _, _ in seen) + engine.phase_s["prefill"] <= elapsed
    assert engine.policy.cost.overhead >= 0.0  # measured


def test_the_plan_chooses_the_draft_width_by_the_brute_force_best_rate():
    """A feature drafter's plan weighs the full width halved down to a chain, each with the value
    curves of trees drafted that wide (the explorations draft every width): where a depth costs
    more per row expanded the narrower draft wins, and the plan is the brute-force best
    (width, depth, nodes) of the rates its curves and costs give."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    def tree(width: int) -> DraftTree:  # the narrower draft misses the full tree's 2nd and 5th best
        parent = torch.tensor([[0, 1, 2, 0, 4, 3]])  # nodes; a chain (width 1) keeps its first three
        depth = torch.tensor([[1, 2, 3, 1, 2, 3]])
        conf = [0.95, 0.9, 0.85, 0.3, 0.2, 0.1] if width == 6 else [0.95, 0.8, 0.75, 0.3, 0.1, 0.05]
        n = 3 if width == 1 else 6
        parent, depth = parent[:, :n], depth[:, :n]
        score = torch.log(torch.tensor([conf[:n]], dtype=torch.float64))
        return DraftTree(torch.zeros(1, n, dtype=torch.long), parent, depth, ancestor_mask(parent, 3), score)

    chosen = []
    for slope in (0.0, 0.0005, 0.002):  # seconds per depth per row expanded
        pol = GoodputPolicy(budget=6, depth=3, width=6)
        assert pol.classes == [1, 2, 3, 6] and [c for _, c in pol.explore] == [3, 3, 3, 0, 1, 2]
        pol.cost = _cost(0.01, 0.0001)
        for rows in (3, 6, 3, 6):
            pol.cost.observe_draft(1, 0.001 + slope * rows, rows=rows)
        _calibrated(pol)
        for _ in range(6 * len(pol.explore)):  # one slot: the first steps explore the list 6 times over
            assert pol.plan(1, 1) == 3
            pol.choose(tree(pol.draft_width), torch.tensor([True]), 1)
            pol.steps += 1
        _bounded(pol)
        rates = {(0, 0, 0): 1 / pol.cost.ar_s(1)}
        for c, w in enumerate(pol.classes):
            for d in (1, 2, 3):
                for n in range(1, 7):
                    draft = d * pol.cost.draft_depth_s(min(w, n))
                    rates[(w, d, n)] = (1 + pol.curves[c].value(pol._worth())[d][n]) / (draft + pol.cost.verify_s(1 + n))
        best = max(rates, key=rates.get)
        d, n = pol._best_plan(1, 1)
        assert (pol.classes[pol._plan_class], d, n) == best or rates[(pol.classes[pol._plan_class], d, n)] == \
            pytest.approx(rates[best]), slope
        assert pol.plan(1, 1) == best[1] and pol.draft_width == min(best[0], best[2])
        chosen.append(pol.draft_width)
    # costlier rows: narrower drafts (2 wide, whose tree is the 3-wide one's here; then the chain)
    assert chosen == [6, 2, 1]


def _chain_tree(*conf: float):
    """One slot's chain: node i at depth i + 1, child of node i - 1, with these draft confidences."""
    from spec_core.decoding.tree import DraftTree, ancestor_mask

    n = len(conf)
    parent = torch.arange(n)[None]
    score = torch.log(torch.tensor([conf], dtype=torch.float64))
    return DraftTree(torch.zeros(1, n, dtype=torch.long), parent, torch.arange(1, n + 1)[None],
                     ancestor_mask(parent, n), score)


def test_value_curves_are_weighed_at_the_calibration_of_the_plan_not_of_the_lesson():
    """A scored drafter's curves keep which confidence buckets its best nodes fell in, and weigh
    them at the acceptance model's current calibration: a curve learnt before the calibration
    moved is worth what its nodes are worth now (oracle: the sum of the current bucket p's of the
    tree's best N nodes), like one learnt after."""
    pol = GoodputPolicy(budget=3, depth=3)
    pol.depths.append(3)
    pol.choose(_chain_tree(0.95, 0.55, 0.15), torch.tensor([True]), 1)  # buckets 9, 5, 1

    def oracle() -> list[float]:
        p_K = pol.acceptance.bucket_p()
        return [0.0] + np.cumsum(p_K[[9, 5, 1]]).tolist()

    assert pol.value[3] == pytest.approx(oracle())
    before = list(pol.value[3])
    # verification finds bucket 5's nodes accepted far less often than the prior said
    depth_BN, real_BN = torch.ones(1, 50, dtype=torch.long), torch.ones(1, 50, dtype=torch.bool)
    pol.acceptance.observe(torch.full((1, 50), math.log(0.55)), depth_BN, real_BN, torch.zeros(1, 50, dtype=torch.bool))
    assert pol.value[3] == pytest.approx(oracle()) and pol.value[3][2] < before[2] - 0.3
    assert pol.value[1] == pytest.approx(oracle()[:2] + [oracle()[1]] * 2)  # depth 1 holds the first node only


def test_the_first_trees_of_a_curve_are_averaged_then_forgotten_at_the_learning_rate():
    """A curve's first trees weigh alike (a running mean: the first tree is not kept whole until
    forgetting catches up, which left a slowly learning plan on whatever the warm-up's first states
    were worth); past 1 / a trees, each new one weighs a."""
    pol = GoodputPolicy(budget=1, depth=1, config=GoodputConfig(alpha=0.2))
    pol.cfg.learn_every = 1
    confs = [0.95, 0.15, 0.55, 0.95, 0.15, 0.55, 0.95, 0.15]
    p_K = pol.acceptance.bucket_p()
    expected = 0.0
    for n, c in enumerate(confs, start=1):
        pol.depths.append(1)
        pol._due = 0  # an exploration: every tree teaches
        pol.choose(_chain_tree(c), torch.tensor([True]), 1)
        a = max(0.2, 1 / n)
        expected += a * (p_K[int(c * 10)] - expected)
        assert pol.value[1][1] == pytest.approx(expected), n
    assert pol.value[1][1] != pytest.approx(float(np.mean(p_K[[int(c * 10) for c in confs]])))


def test_drafting_back_to_back_takes_an_ar_probe_in_ar_probe_every():
    """A plan that drafts every step would never see an ordinary AR step: AR's seconds would rest on
    the trees' line and on the AR-shaped verifies after an exploration's draft (measured on a CPU,
    Token Recycling at batch 4: 5.48 ms, where ordinary AR steps measured 5.02 and the plan drafted
    at 0.94x AR). So after `ar_probe_every` drafting steps come two AR steps - none while
    exploring - and only the second, an AR step after an AR step, is an AR measurement
    (`CostModel.ar_s`): the first after tree steps runs slower too (5.5 against 5.05-5.2 ms)."""
    pol = _trained_policy(0.01, 0.0001, per_depth=0.0001)
    pol.cfg.ar_probe_every = 8
    plans = [pol.plan(1, 1) for _ in range(45)]
    assert [i for i, d in enumerate(plans) if d == 0] == [8, 9, 18, 19, 28, 29, 38, 39]
    pol = _trained_policy(0.01, 0.0001, per_depth=0.0001)
    pol.cfg.ar_probe_every = 10**9  # no probes: the plan drafts every step
    assert 0 not in [pol.plan(1, 1) for _ in range(45)]
    pol = GoodputPolicy(budget=6, depth=3, config=GoodputConfig(ar_probe_every=1))  # exploring: every step drafts
    assert 0 not in [pol.plan(1, 1) for _ in range(3)] and pol._since_ar == 0


def test_ar_seconds_are_measured_on_an_ar_step_after_an_ar_step():
    from spec_core.decoding.tree import empty_tree

    pol = GoodputPolicy(budget=3, depth=3, depth_scaled=False)
    none, empty = empty_tree(1, "cpu"), torch.zeros(1, 0, dtype=torch.long)
    args = (empty, torch.tensor([0]), torch.tensor([True]))
    pol.observe(_chain(3), 1, 0.020, 0.001, 3, torch.tensor([[1, 2, 3]]), torch.tensor([3]), torch.tensor([True]))
    pol.observe(none, 1, 0.012, 0.0, 0, *args)  # right after a tree: not AR's price
    assert pol.cost.ar == {}
    pol.observe(none, 1, 0.010, 0.0, 0, *args)
    assert pol.cost.ar == {1: pytest.approx(0.010)}


def test_ar_probes_are_further_apart_the_more_a_probe_loses_to_the_plan():
    """A probe's AR steps lose their seconds x (1 - AR's rate / the plan's) against the plan: the
    gap between probes makes that `ar_probe_share` of the ordinary steps between, never under
    `ar_probe_every`."""
    pol = _trained_policy(0.01, 0.0001, per_depth=0.0001)
    pol.cfg.ar_probe_every, pol.step_s = 8, 0.012
    assert pol.plan(1, 1) > 0
    t_ar = pol.cost.ar_s(1)
    loss = 2 * t_ar * (1 - (1 / t_ar) / pol.rate)  # two AR steps; n_active = 1: the rate is the plan's
    gap = math.ceil(loss / (pol.cfg.ar_probe_share * pol.step_s))
    assert gap > 8
    plans = [pol.plan(1, 1) for _ in range(2 * gap + 4)]
    assert [i for i, d in enumerate(plans) if d == 0] == [gap - 1, gap, 2 * gap + 1, 2 * gap + 2]
    pol.cfg.ar_probe_share = 1.0  # a probe loses little next to the steps between: every ar_probe_every
    assert pol._ar_gap() == 8


@pytest.mark.parametrize("slots, rounds", [(1, 6), (2, 3), (4, 2), (16, 1)])
def test_the_first_explorations_give_each_entry_explore_rows_slot_trees(slots, rounds):
    """Width classes' first curves rest on their explorations alone: the first steps run the
    exploration list until each entry has taught `explore_rows` (6) slot-trees, by the active
    slots of the first plan; a policy of one class (a proposer) explores its list once."""
    def explored(pol: GoodputPolicy, slots: int) -> list[int]:
        _calibrated(pol).plan(slots, slots)
        seen = []
        while (k := pol._exploring()) is not None and len(seen) < 100:
            seen.append(k)
            pol.steps += 1
        return seen

    pol = GoodputPolicy(budget=6, depth=3, width=6)
    assert explored(pol, slots) == list(range(len(pol.explore))) * rounds
    figures = GoodputPolicy(budget=6, depth=3, width=6, prior=(0.8, 0.6, 0.5))  # a drafter's own: once
    assert explored(figures, slots) == list(range(len(figures.explore)))
    proposer = GoodputPolicy(budget=6, depth=3, depth_scaled=False)
    assert explored(proposer, slots) == list(range(len(proposer.explore)))


def test_under_cuda_graph_buckets_a_step_verifies_a_whole_bucket():
    """A tree is padded up to its token bucket (CUDA graphs), so a node count inside a bucket costs
    what the bucket does: the choice fills the bucket (1 + N a bucket size), and the seconds the
    plan weighs are the padded ones."""
    from spec_core.decoding.compiled import TOKEN_BUCKETS, Buckets

    cost = CostModel(pad=Buckets(graphs=True).tokens)
    for tokens in (1, 2, 4, 8, 16, 32, 64):
        cost.observe(tokens, 1e-3 + 1e-4 * tokens)  # verify seconds: a line in the tokens run
    assert cost.run_tokens(11) == 16 and list(cost.run_tokens(np.array([1, 3, 40]))) == [1, 4, 64]
    seconds = step_seconds(cost, 1, 40)
    assert seconds[9] == seconds[15] < seconds[16]  # 10..16 tokens per row: one bucket
    for p in (0.9, 0.6, 0.3):
        n, _ = choose_nodes(np.full((1, 40), p), np.array([True]), 1, cost)
        assert 1 + n in TOKEN_BUCKETS, (p, n)


def _simulate(pol: GoodputPolicy, steps: int, verify, per_depth: float, accepted: bool,
              commit: float = 0.0) -> tuple[float, float]:
    """Drive a policy as the engine does over `steps` batch-1 steps on synthetic costs (verify(T)
    seconds for T tokens, per_depth a draft depth, `commit` what committing a tree costs beyond
    an AR step) with every drafted node rejected, or every node of the chain 1 -> 2 -> 3
    accepted. Returns (seconds, tokens)."""
    from spec_core.decoding.tree import empty_tree, truncate

    seconds = tokens = 0.0
    one = torch.tensor([True])
    for _ in range(steps):
        d = pol.plan(1, 1)
        tree, path, n = empty_tree(1, "cpu"), torch.zeros(1, 0, dtype=torch.long), torch.tensor([0])
        if d:
            full = _confident_tree()
            tree = truncate(pol.choose(full, one, 1), pol.chosen[-1])
            if accepted:
                k = min(tree.size, 3, d)
                path, n = torch.arange(1, k + 1)[None], torch.tensor([k])
        verify_s, draft_s, commit_s = verify(1 + tree.size), d * per_depth, commit if tree.size else 0.0
        pol.cost.observe_commit(tree.size > 0, commit_s)
        pol.observe(tree, 1, verify_s, draft_s, d if tree.size else 0, path, n, one,
                    wall_s=verify_s + draft_s + commit_s)
        seconds += verify_s + draft_s + commit_s
        tokens += 1 + int(n[0])
    return seconds, tokens


@pytest.mark.parametrize("per_depth", [0.0001, 0.012])
def test_where_nothing_pays_learning_costs_a_bounded_share_of_ar_time(per_depth):
    """Every drafted node rejected: learning (explorations and probes) is spent while what it lost
    to AR stays within learn_share of AR's seconds for the tokens so far plus learn_allowance AR
    steps - then the steps are AR's, probes rare. Where a draft depth costs what a verification
    does (a tiny world's drafter), no chain could pay even accepted: nothing is learnt after the
    first two calibrating steps."""
    verify = lambda t: 0.01 + 0.002 * t  # noqa: E731 - AR 12 ms; a 7-token verify 24 ms
    pol = GoodputPolicy(budget=6, depth=3)
    seconds, tokens = _simulate(pol, 3000, verify, per_depth, accepted=False)
    t_ar = verify(1)
    assert tokens == 3000  # nothing accepted: AR's seconds for them are 3000 AR steps
    assert seconds <= 3000 * t_ar * (1 + pol.cfg.learn_share) + (pol.cfg.learn_allowance + 3) * t_ar  # + one step's overshoot
    assert pol.learn_loss <= pol.cfg.learn_share * pol.ar_time + (pol.cfg.learn_allowance + 3) * t_ar
    assert pol.depths[-1000:].count(0) >= 1000 * (1 - pol.cfg.learn_share) - 10  # AR, probes rare
    if per_depth >= 0.01:
        assert not pol.may_pay(1) and pol.explorations + pol.probes == 2
        assert pol.depths[2:] == [0] * 2998


def test_the_first_steps_calibrate_with_a_one_node_chain_then_an_ar_step():
    """A fresh policy's first step drafts one depth at its narrowest width and verifies its one
    node, its second is AR: every cost term is measured before any costlier draft is weighed."""
    from spec_core.decoding.tree import empty_tree

    pol = GoodputPolicy(budget=6, depth=3, width=6)
    one = torch.tensor([True])
    assert pol.plan(1, 1) == 1 and pol.draft_width == 1
    chain = pol.choose(_confident_tree(), one, 1)
    assert chain.size == 1
    pol.observe(chain, 1, 0.011, 0.001, 1, torch.tensor([[1]]), torch.tensor([1]), one, draft_width=1, wall_s=0.013)
    assert pol.plan(1, 1) == 0
    pol.observe(empty_tree(1, "cpu"), 1, 0.010, 0.0, 0, torch.zeros(1, 0, dtype=torch.long), torch.tensor([0]), one,
                wall_s=0.0105)
    assert pol.explorations == CALIBRATE and pol.cost.commit_extra() >= 0 and pol.cost.varied
    assert pol.cost.draft_per_depth == pytest.approx(0.001) and pol.cost.overhead_s() > 0


@pytest.mark.parametrize("figures", [(0.37, 0.38, 0.35), None])
def test_a_drafter_whose_figures_cannot_pay_learns_nothing_after_calibrating(figures):
    """The QUICK demo's case (measured there: a draft depth 0.74 ms, a commit 0.47 ms beyond AR's,
    an AR step 0.87 ms): a drafter whose own figures say its chain accepts ~0.37 per step. Every
    node accepted, a 3-deep chain would beat AR; at the upper confidence bound of what its curves
    (the figures, worth explore_rows slot-trees) could still reveal, no plan does: after the two
    calibrating steps nothing is explored or probed and the policy settles on AR. The same costs
    without figures (an untrained drafter) are weighed at full acceptance: it explores."""
    verify = lambda t: 0.0087 + 0.0003 * t  # noqa: E731 - AR 9 ms
    pol = GoodputPolicy(budget=6, depth=3, prior=figures)
    _simulate(pol, 300, verify, 0.0074, accepted=False, commit=0.0047)
    if figures is None:
        assert pol.explorations > CALIBRATE
    else:
        assert pol.explorations == CALIBRATE and pol.probes == 0 and pol.settled
        assert pol.depths[CALIBRATE:] == [0] * (300 - CALIBRATE)


def test_a_learning_step_that_costs_more_than_the_allowance_waits_for_the_share():
    """A learning step counts its own expected loss (its draft and verification less AR's seconds
    for the tokens expected: here none past the bonus) before it runs: a 12-deep draft that costs
    ~5 AR steps does not run on a 4-step allowance (though a chain accepted whole would pay), but
    once AR's share covers it."""
    pol = _bounded(_calibrated(GoodputPolicy(budget=12, depth=12)))
    pol.cost = _cost(0.01, 0.0001)  # AR ~10 ms; a depth of draft 4 ms
    pol.cost.draft_per_depth = 0.004
    t_ar = pol.cost.ar_step_s(1)
    seconds = step_seconds(pol.cost, 1, 12)
    n = max(i for i in range(13) if (1 + min(i, 12)) * t_ar >= seconds[i])  # the most nodes that could pay
    assert pol._expected_loss(1, 12, 0) == pytest.approx(12 * 0.004 + seconds[n] - t_ar)
    assert pol._expected_loss(1, 12, 0) > pol.cfg.learn_allowance * t_ar and pol.may_pay(1)
    assert not pol._may_learn(1, 12, 0)
    pol.ar_time = 1e3  # AR's seconds so far: 2% of them cover it
    assert pol._may_learn(1, 12, 0)


def test_the_upper_bound_is_full_acceptance_unmeasured_and_narrows_with_slot_trees():
    """`V_upper`: min(d, N) where nothing is known; the learnt value plus optimism x cap / sqrt(n)
    (at most cap) once n slot-trees taught it."""
    pol = GoodputPolicy(budget=4, depth=2)
    curves, worth = pol.curves[-1], pol._worth()
    assert curves.V_upper(worth, 1.22).tolist() == [[1, 1, 1, 1], [1, 2, 2, 2]]
    tree = _confident_tree()
    for n in (1, 16):
        fresh = GoodputPolicy(budget=4, depth=2).curves[-1]
        for _ in range(n):
            fresh.learn(np.full((1, 6), 0.0), _host(tree.depth_BN).clip(max=2), np.array([True]), 2)  # p's of 0
        upper = fresh.V_upper(worth, 1.22)
        cap = np.minimum(np.arange(1, 3)[:, None], np.arange(1, 5)[None])
        assert upper == pytest.approx(np.minimum(cap, 1.22 * cap / np.sqrt(n)))


def test_where_drafts_pay_learning_is_never_held():
    """Every chain node accepted at a cheap draft: explorations beat AR, so their loss is a gain
    and they keep their schedule (re-explorations every `reexplore` steps or so)."""
    pol = GoodputPolicy(budget=6, depth=3)
    seconds, tokens = _simulate(pol, 2000, lambda t: 0.01 + 0.0001 * t, 0.0001, accepted=True)
    assert pol.learn_loss < 0 and tokens / seconds > 2 / 0.0101
    assert pol.explorations >= len(pol.explore) + 2000 // (2 * pol.cfg.reexplore)


def test_a_policy_settled_on_ar_retires_the_drafter_and_outputs_stay_ar(tiny_world):
    """Where the plan is AR and nothing may be learnt (here: no draft could pay even accepted),
    the policy settles on AR for good after its two calibrating steps: the engine feeds and
    prefills the drafter no more, and the outputs are AR's token for token."""
    from spec_core.decoding import DecodeEngine, Request, TreeConfig
    from tests.spec_core.decoding.conftest import prompt_inputs

    adapter, processor, drafter, evals, _ = tiny_world
    reqs = [Request(prompt_inputs(processor, s), 12, s["id"]) for s in evals]
    ar = {r.key: r.sequences[0].tolist() for r in DecodeEngine(adapter, batch_size=2, capacity=512).generate(reqs)}
    engine = DecodeEngine(adapter, drafter, batch_size=2, capacity=512, tree=TreeConfig(3, 3, 8, policy="goodput"))
    engine.policy.may_pay = lambda rows: False
    engine.policy._best_plan = lambda n_active, rows: (0, 0)  # the plan: AR (whatever this machine's timings)
    fed, prefilled = [], []
    feed, prefill = engine._drafter_catch_up, engine._drafter_prefill
    engine._drafter_catch_up = lambda *a: (fed.append(engine.policy.steps), feed(*a))[1]
    engine._drafter_prefill = lambda *a: (prefilled.append(engine.policy.steps), prefill(*a))[1]
    out = {r.key: r.sequences[0].tolist() for r in engine.generate(reqs)}
    pol = engine.policy
    assert out == ar and pol.settled and pol.explorations == 2 and pol.depths[2:] == [0] * (len(pol.depths) - 2)
    settled_at = 3  # the third plan settles (its step number: 2)
    assert all(s < settled_at for s in fed) and all(s < settled_at for s in prefilled) and prefilled


@pytest.mark.parametrize("accepted, settles", [(0.0, True), (30.0, False)])
def test_only_a_drafter_past_hope_is_settled_on_ar(accepted, settles):
    """Learning spent and the plan AR: a drafter whose verified trees had almost nothing accepted
    (untrained) settles on AR for good; one that accepted several nodes per tree does not - it
    stays AR while the budget is spent and probes again once the share of AR's time allows."""
    pol = _doubtful_policy()
    pol.learn_loss, pol.tried_rows, pol.accepted = 1.0, 10, accepted  # the budget spent
    assert [pol.plan(1, 1) for _ in range(50)] == [0] * 50 and pol.settled == settles
    pol.ar_time = 1e6  # AR's seconds so far: the budget's share covers the loss again
    assert settles or any(pol.plan(1, 1) for _ in range(200))


def test_prior_curves_are_the_top1_chains_expected_accepted_nodes():
    """V_d(N) from top-1 agreement a_1, a_2 (a_2 again past it): the accepted nodes of the first
    min(d, N) chain nodes, each accepted with the product of the a's along its path."""
    a = (0.8, 0.5)
    V = prior_curves(a, depth=3, budget=5)
    chain = [0.0, 0.8, 0.8 + 0.8 * 0.5, 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.5]
    for d in (1, 2, 3):
        assert V[d - 1].tolist() == pytest.approx([chain[min(d, n)] for n in range(6)])


def test_a_drafter_with_figures_plans_on_them_after_one_round_of_explorations():
    """With its figures the policy's curves start at `prior_curves` (every depth plannable before
    any tree), worth explore_rows slot-trees against the trees learnt; the first explorations run
    once, not explore_rows / slots times over; a learnt tree moves the curve by its share."""
    a = (0.9, 0.8, 0.7)
    pol = GoodputPolicy(budget=6, depth=3, width=6, prior=a)
    prior = prior_curves(a, 3, 6)
    assert pol.value == [None, *prior.tolist()] and pol.curves[0].plannable()
    _calibrated(pol).plan(1, 1)
    assert pol._initial == CALIBRATE + len(pol.explore)  # batch 1 without figures: 6 rounds
    flat = GoodputPolicy(budget=6, depth=3, width=6)
    _calibrated(flat).plan(1, 1)
    assert flat._initial == CALIBRATE + 6 * len(flat.explore) and flat.value == [None] * 4 and not flat.curves[0].plannable()
    full = pol.curves[-1]
    tree = _confident_tree()
    full.learn(np.full((1, 6), 0.5), _host(tree.depth_BN), np.array([True]), 3)  # one slot-tree of p's 0.5
    learnt = np.cumsum(np.concatenate([[0.0], np.full(6, 0.5)]))
    W = pol.cfg.explore_rows
    assert full.value(np.ones(1))[3] == pytest.approx(((learnt + W * prior[2]) / (1 + W)).tolist())


@pytest.mark.parametrize("prior", [None, (0.02, 0.01, 0.01)])
def test_a_drafter_whose_figures_say_it_cannot_pay_settles_on_ar_no_later(prior):
    """A drafter whose own figures say it is hopeless (top-1 ~2%) runs one round of explorations
    and settles on AR; without figures it learns the same from its trees: settled too, after at
    least as many learning steps."""
    verify = lambda t: 0.01 + 0.002 * t  # noqa: E731
    pol = GoodputPolicy(budget=6, depth=3, width=6, prior=prior)
    _simulate(pol, 600, verify, 0.0001, accepted=False)
    assert pol.settled and pol.depths[-100:] == [0] * 100
    flat = GoodputPolicy(budget=6, depth=3, width=6)
    _simulate(flat, 600, verify, 0.0001, accepted=False)
    assert flat.settled and pol.explorations + pol.probes <= flat.explorations + flat.probes


def test_a_saved_drafters_figures_are_its_policys_prior_and_old_directories_load(tiny_world, tmp_path):
    """A drafter saved with its top-1 figures (acceptance.json) loads with them, and an engine's
    goodput policy starts from them; one saved without (untrained, or saved before figures were)
    loads as before and its policy starts from nothing. Medusa heads carry theirs too."""
    from spec_core.decoding import DecodeEngine, TreeConfig, load_drafter
    from spec_core.medusa import MedusaConfig, MedusaHeads
    from spec_core.targets.saved import ACCEPTANCE

    adapter, _, drafter, _, _ = tiny_world
    tree = TreeConfig(3, 3, 8, policy="goodput")
    drafter.acceptance = (0.9, 0.7)
    try:
        drafter.save_pretrained(tmp_path / "with")
    finally:
        drafter.acceptance = None
    drafter.save_pretrained(tmp_path / "without")
    assert (tmp_path / "with" / ACCEPTANCE).exists() and not (tmp_path / "without" / ACCEPTANCE).exists()
    loaded = load_drafter(tmp_path / "with", adapter)
    assert loaded.acceptance == (0.9, 0.7)
    pol = DecodeEngine(adapter, loaded, capacity=256, tree=tree).policy
    assert pol.value == [None, *prior_curves((0.9, 0.7), 3, 8).tolist()]
    old = load_drafter(tmp_path / "without", adapter)
    assert old.acceptance is None and torch.equal(old.fc.weight, drafter.fc.weight)
    assert DecodeEngine(adapter, old, capacity=256, tree=tree).policy.value == [None] * 4
    text = adapter.text_config
    heads = MedusaHeads(MedusaConfig(num_heads=2), text.hidden_size, text.vocab_size,
                        {"hidden_size": text.hidden_size, "vocab_size": text.vocab_size})
    heads.acceptance = (0.6, 0.3)
    heads.save_pretrained(tmp_path / "medusa")
    assert load_drafter(tmp_path / "medusa", adapter).acceptance == (0.6, 0.3)
    heads.acceptance = None  # saved again without figures: the old ones go
    heads.save_pretrained(tmp_path / "medusa")
    assert load_drafter(tmp_path / "medusa", adapter).acceptance is None
    with pytest.raises(ValueError, match="top-1"):
        save_acceptance(tmp_path / "bad", (1.5,))


def test_engines_that_share_a_policy_start_from_what_the_first_learnt(tiny_world):
    """A second engine handed the first one's policy (a generate actor's next shard) continues
    it: no first explorations again, only the re-explorations due; and a policy that settled on
    AR stays settled - the next engine never prefills the drafter. Outputs stay AR's token for
    token; a policy of another tree is refused."""
    from spec_core.decoding import DecodeEngine, Request, TreeConfig
    from tests.spec_core.decoding.conftest import prompt_inputs

    adapter, processor, drafter, evals, _ = tiny_world
    reqs = [Request(prompt_inputs(processor, s), 12, s["id"]) for s in evals]
    ar = {r.key: r.sequences[0].tolist() for r in DecodeEngine(adapter, batch_size=2, capacity=512).generate(reqs)}
    tree = TreeConfig(3, 3, 8, policy="goodput")
    first = DecodeEngine(adapter, drafter, batch_size=2, capacity=512, tree=tree)
    pol = first.policy
    pol.may_pay = lambda rows: True  # learning may run, whatever this machine's timings
    pol.cfg.learn_allowance = 1e9
    assert {r.key: r.sequences[0].tolist() for r in first.generate(reqs)} == ar
    learnt = pol.stats()
    assert pol.steps >= pol._initial == CALIBRATE + 3 * len(pol.explore) <= learnt["explorations"]  # the flat start
    second = DecodeEngine(adapter, drafter, batch_size=2, capacity=512, tree=tree, policy=pol)
    assert second.policy is pol
    assert {r.key: r.sequences[0].tolist() for r in second.generate(reqs)} == ar
    steps = pol.steps - learnt["steps"]
    assert steps > pol.cfg.reexplore and pol.explorations - learnt["explorations"] <= 1 + steps // pol.cfg.reexplore

    pol.may_pay = lambda rows: False  # now nothing can pay: the plan settles on AR
    pol._best_plan = lambda n_active, rows: (0, 0)
    pol._planned = None  # (the plan, and what learning was weighed on with it, are weighed again)
    list(second.generate(reqs[:2]))
    assert pol.settled
    third = DecodeEngine(adapter, drafter, batch_size=2, capacity=512, tree=tree, policy=pol)
    prefilled = []
    prefill = third._drafter_prefill
    third._drafter_prefill = lambda *a: (prefilled.append(1), prefill(*a))[1]
    assert {r.key: r.sequences[0].tolist() for r in third.generate(reqs)} == ar and prefilled == []
    with pytest.raises(ValueError, match="cannot serve"):
        DecodeEngine(adapter, drafter, batch_size=2, capacity=512, tree=TreeConfig(3, 3, 12, policy="goodput"),
                     policy=pol)
