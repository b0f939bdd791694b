"""spec_core.decoding.cost_curve: the band curve against known cost functions (a line, a concave
CPU-like curve), its monotonicity under noise, that a rare large tree's band is not forgotten, and
that the goodput chooser on it picks the brute-force optimum of the true costs."""

from __future__ import annotations

import random

import pytest
import torch

from spec_core.decoding.cost_curve import BandCurve, _isotonic
from spec_core.decoding.goodput import CostModel, choose_nodes


def _concave(t: float) -> float:
    """Seconds of a verify of t tokens: 0.2 ms per token up to 18 tokens, 0.1 beyond (the shape
    measured on 2 cores at batch 2)."""
    return 4e-3 + 2e-4 * min(t, 18) + 1e-4 * max(t - 18, 0)


def test_on_a_line_the_curve_is_the_line_inside_and_beyond_the_bands():
    cm = CostModel(curve=BandCurve())
    for _ in range(3):
        for t in (4, 8, 16, 32, 64):
            cm.observe(t, 0.01 + 0.002 * t)
    for t in (1, 3, 4, 6, 12.5, 40, 64, 100, 200):
        assert cm.verify_s(t) == pytest.approx(0.01 + 0.002 * t)
    t_K = torch.tensor([2.0, 10.0, 90.0], dtype=torch.float64)
    assert torch.allclose(cm.verify_s(t_K), 0.01 + 0.002 * t_K)


def test_one_band_is_not_a_curve_yet():
    cm = CostModel(curve=BandCurve())
    cm.observe(8, 0.05)
    cm.observe(8, 0.07)
    assert cm.curve.bands == 1 and cm.verify_s(40) == pytest.approx(0.06, abs=1e-3)  # the line: flat through the mean


def test_the_curve_follows_a_concave_cost_the_line_does_not():
    cm = CostModel(curve=BandCurve())
    for t in (82, 42, 22, 2):  # the explorations: the budget, half, a quarter, AR
        cm.observe(t, _concave(t))
    for _ in range(300):  # then the small trees a policy chose, many times
        for t in (8, 10, 12, 14):
            cm.observe(t, _concave(t))
    for t in (2, 8, 14, 22, 30, 42, 60, 82):
        assert cm.verify_s(t) == pytest.approx(_concave(t), rel=0.06), t
    assert cm.at(82) > 1.3 * _concave(82)  # the forgetting line, fitted on 8-14 tokens: far above


def test_a_noisy_curve_is_non_decreasing_and_pav_is_the_least_squares_fit():
    rnd = random.Random(0)
    curve = BandCurve()
    for _ in range(200):
        t = rnd.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
        curve.observe(t, 1e-3 * (1 + 0.01 * t) * rnd.uniform(0.5, 1.5))
    _, y_K = curve.points()
    assert bool((y_K[1:] >= y_K[:-1]).all())
    assert _isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert _isotonic([3.0, 1.0], [3, 1]) == [2.5, 2.5]
    assert _isotonic([1.0, 2.0], [1, 1]) == [1.0, 2.0]


def test_a_slowdown_seen_in_the_visited_bands_moves_the_rare_ones_too():
    curve = BandCurve()
    for i in range(400):  # a policy's small trees, and an exploration's large one now and then
        curve.observe(4, 0.002)
        if i % 32 == 0:
            curve.observe(40, 0.010)
    for _ in range(30):  # the machine slowed down 2x: only the small trees are measured
        curve.observe(4, 0.004)
    assert curve.at(4, slope=0.0) == pytest.approx(0.004, rel=0.02)
    # not the older 0.010: the scale takes most of the move (the visited band's own mean some of it)
    assert 0.017 < curve.at(40, slope=0.0) < 0.0205
    unscaled = BandCurve(scale_alpha=0.0)  # each band alone: the rare one keeps its old figure
    for i in range(400):
        unscaled.observe(4, 0.002)
        if i % 32 == 0:
            unscaled.observe(40, 0.010)
    for _ in range(30):
        unscaled.observe(4, 0.004)
    assert unscaled.at(40, slope=0.0) < 0.011


def test_a_band_whose_cost_alone_changed_learns_its_new_place():
    curve = BandCurve()
    for _ in range(100):
        curve.observe(40, 0.010)
        curve.observe(4, 0.002)
    for _ in range(200):  # the large band alone got slower; the small one is still measured
        curve.observe(40, 0.020)
        curve.observe(4, 0.002)
    assert curve.at(40, slope=0.0) == pytest.approx(0.020, rel=0.05)
    assert curve.at(4, slope=0.0) == pytest.approx(0.002, rel=0.05)


def test_the_chooser_on_the_curve_picks_the_optimum_of_the_true_costs():
    p_BN = torch.tensor([[0.9, 0.85, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3, 0.25, 0.2] + [0.1] * 8] * 2,
                        dtype=torch.float64)
    active = torch.tensor([True, True])
    rows = 2
    true = [(rows + float(p_BN[:, :n].sum())) / _concave(rows * (1 + n)) for n in range(p_BN.shape[1] + 1)]
    curved, line = CostModel(curve=BandCurve()), CostModel()
    for cm in (curved, line):
        for t in (42, 22, 12, 2):
            cm.observe(t, _concave(t))
        for _ in range(200):  # a policy that had been verifying 3-6 nodes per slot
            for n in (3, 4, 5, 6):
                cm.observe(rows * (1 + n), _concave(rows * (1 + n)))
    n_curve, _ = choose_nodes(p_BN, active, rows, curved)
    n_line, _ = choose_nodes(p_BN, active, rows, line)
    assert true[n_curve] == pytest.approx(max(true), rel=0.01)
    assert n_line < n_curve and true[n_line] < 0.97 * max(true)  # the line's trap, for contrast
