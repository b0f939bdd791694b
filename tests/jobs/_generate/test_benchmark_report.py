"""The benchmark report's statistics against hand-computed oracles."""

from __future__ import annotations

import pytest

from jobs._generate.benchmark_report import bootstrap_speedups, per_sample_speedup, visual_split


def _rows(latency: dict[str, list[float]]) -> list[dict]:
    """One turn per sample; latency[method][i] of sample i."""
    return [{"id": f"s{i}", "method": m, "latency_s": t} for m, ts in latency.items() for i, t in enumerate(ts)]


def test_per_sample_speedup_sums_a_samples_turns():
    rows = _rows({"ar": [2.0, 4.0], "x": [1.0, 4.0]}) + [{"id": "s0", "method": "x", "latency_s": 1.0}]
    assert per_sample_speedup(rows, ["ar", "x"], "ar") == {"ar": 1.0, "x": (1.0 + 1.0) / 2}


def test_bootstrap_intervals_hold_the_point_and_find_ties_and_gaps():
    n = 200
    ar = [1.0 + (i % 7) * 0.1 for i in range(n)]
    fast = [t / 2 for t in ar]                                        # exactly 2x on every sample
    twin = [t / 2 * (1.02 if i % 2 else 0.98) for i, t in enumerate(ar)]  # 2x up to noise
    slow = [t / 1.2 for t in ar]
    b = bootstrap_speedups(_rows({"ar": ar, "fast": fast, "twin": twin, "slow": slow}),
                           ["ar", "fast", "twin", "slow"], "ar", n=500)
    assert b["interval"]["fast"] == pytest.approx((2.0, 2.0))
    lo, hi = b["interval"]["twin"]
    assert lo < sum(ar) / sum(twin) < hi and hi - lo < 0.05
    assert b["best"] in ("fast", "twin")
    other = "twin" if b["best"] == "fast" else "fast"
    assert b["gap"][other][0] <= 0 <= b["gap"][other][1]   # within noise of the best
    assert b["gap"]["slow"][1] < -0.7                        # clearly behind
    assert bootstrap_speedups([], ["ar", "x"], "ar") == {"interval": {}, "best": None, "gap": {}}


def test_visual_split_counts_steps_by_share():
    rows = [{"method": "x", "visual_shares": [0.1, 0.5, 0.35], "accept_lengths": [3, 1, 2]}]
    split = visual_split(rows, ["x"], 0.35)
    assert split["x"] == {"high": {"steps": 2, "mat": 0.5}, "low": {"steps": 1, "mat": 2.0}}
