"""The window chooser of `window: auto` on synthetic costs and commits: every candidate explored
first (largest first), then the largest window where a forward's length is free, AR where each
token is dear and drafts are rarely accepted, the optimum of E[k | L] / t(L) in between;
neighbours re-explored; capped iterations at a request's end, and the first after a change of L,
not counted."""

import pytest
import torch

from spec_core.scd.window import WindowChooser


def _run(ch: WindowChooser, iterations: int, a: float, b: float, commits, rows: int = 2) -> list[int]:
    """Drive the chooser: an iteration at L costs a + b rows L and commits commits(L) per sample."""
    for _ in range(iterations):
        L = ch.choose(rows)
        ch.observe(L, rows, a + b * rows * L, torch.full((rows,), commits(L) - 1))
    return ch.chosen


def test_explores_every_candidate_largest_first():
    ch = WindowChooser(32, segment=2)
    assert ch.candidates == [32, 16, 8, 4, 2, 1]
    assert _run(ch, 12, 0.01, 0.0, lambda L: 1)[::2] == [32, 16, 8, 4, 2, 1]
    assert ch.cost.ready and set(ch.expected_commits()) == set(ch.candidates)


def test_free_forward_length_picks_the_largest_window():
    ch = WindowChooser(16, segment=2, reexplore=1000)
    chosen = _run(ch, 40, 0.01, 0.0, lambda L: 1 + L // 4)
    assert chosen[-10:] == [16] * 10


def test_dear_tokens_and_rare_acceptance_pick_ar():
    ch = WindowChooser(16, segment=2, reexplore=1000)
    chosen = _run(ch, 40, 0.001, 0.01, lambda L: 1 + (L > 8))
    assert chosen[-10:] == [1] * 10


def test_optimum_between():
    """Every sample commits min(L, 4) tokens: with a real intercept and slope, L = 4 (longer
    windows pay for rows that commit nothing)."""
    ch = WindowChooser(16, segment=2, reexplore=1000)
    chosen = _run(ch, 40, 0.01, 0.001, lambda L: min(L, 4))
    assert chosen[-10:] == [4] * 10
    assert ch.expected_commits()[16] == pytest.approx(4.0) and ch.best(2) == 4


def test_reexplores_the_neighbours_of_the_best():
    ch = WindowChooser(16, segment=2, reexplore=4)
    chosen = _run(ch, 80, 0.01, 0.001, lambda L: min(L, 4))
    assert set(chosen[10:]) == {2, 4, 8}  # after the 5 first segments: the best and its neighbours
    assert chosen[10:].count(4) > 50


def test_the_first_iteration_after_a_change_is_not_counted():
    ch = WindowChooser(4, segment=3)
    _run(ch, 6, 0.01, 0.0, lambda L: 2)  # a segment at 4, then one at 2
    assert ch.iters == {4: 6.0, 2: 4.0, 1: 0.0}  # 2 rows x 3 iterations; 2 rows x 2 (one settling)


def test_capped_iterations_are_not_counted():
    ch = WindowChooser(8, segment=4)
    L = ch.choose(1, cap=3)  # 3 tokens left: L = 3, not the segment's 8
    assert L == 3
    ch.observe(L, 1, 0.01, torch.tensor([2]), left_B=torch.tensor([3]))
    assert ch.expected_commits() == {}
    ch.observe(ch.choose(1), 1, 0.01, torch.tensor([7]), left_B=torch.tensor([100]))
    assert ch.expected_commits() == {8: 8.0}


def test_max_window_one_is_ar():
    ch = WindowChooser(1)
    assert ch.candidates == [1] and [ch.choose(4) for _ in range(5)] == [1] * 5
    ch.observe(1, 4, 0.01, torch.zeros(4, dtype=torch.long))
    assert ch.stats()["mean_window"] == 1.0


def test_estimates_never_fall_with_the_window():
    """A longer window commits at least what a shorter one does from the same state: a dip is
    noise, so it is lifted; with free length, ties go to the longer window."""
    ch = WindowChooser(32, segment=2, reexplore=1000)
    _run(ch, 12, 0.01, 0.0, lambda L: 3 if L in (8, 16) else 1)
    assert ch.expected_commits() == {4: 1.0, 8: 3.0, 16: 3.0, 32: 3.0}  # 2 and 1 cannot win
    assert ch.best(2) == 32


def test_skips_windows_that_cannot_win():
    """Free length and 5 tokens per iteration at 16: a window of 4 commits at most 4 per
    iteration at the same cost, so it is never tried (nor 2, nor 1)."""
    ch = WindowChooser(16, segment=2, reexplore=1000)
    chosen = _run(ch, 20, 0.01, 0.0, lambda L: min(L, 5))
    assert set(chosen) == {16, 8}


def test_the_bound_reads_the_histogram_of_commits():
    """Half the samples commit 1 per iteration at 16, half 9 (mean 5). One window's timings say
    nothing of the slope, so every shorter window is still worth a try; at 8 (commits 1 and 8) the
    cost line is known: 8 commits 4.5 per 18 ms, and a window of 4 at most E[min(k, 4)] = 2.5 per
    14 ms (not min(4, 4.5) = 4), which cannot win, so 4 is never run, nor 2 or 1, and the chooser
    says it is no longer exploring."""
    ch = WindowChooser(16, segment=2, reexplore=1000)
    rows, a, b = 2, 0.01, 0.0005
    assert ch.exploring(rows)
    for _ in range(2):  # a segment at 16: sample 0 commits 1, sample 1 commits 9
        L = ch.choose(rows)
        ch.observe(L, rows, a + b * rows * L, torch.tensor([0, 8]))
    assert ch.commit_bound(4) == pytest.approx(2.5) and ch.commit_bound(8) == pytest.approx(4.5)
    assert ch.commit_bound(16) == pytest.approx(5.0)
    assert ch.worth_trying(rows) == [8, 4, 2, 1]  # the slope is not known yet
    for _ in range(2):  # 8 commits min(k, 8)
        L = ch.choose(rows)
        assert L == 8
        ch.observe(L, rows, a + b * rows * L, torch.tensor([0, 7]))
    assert ch.cost.verify_s(8) == pytest.approx(a + b * 8)
    assert not ch.exploring(rows) and ch.iters[4] == 0
    assert [ch.choose(rows) for _ in range(6)] == [8] * 6
