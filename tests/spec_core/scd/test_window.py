"""The window chooser of `window: auto` on synthetic costs and commits: one window per request,
every candidate that could win explored first (largest first), then the largest window where a
forward's length is free, AR where each token is dear and drafts are rarely accepted, the optimum
of E[k | L] / t(L) in between; neighbours re-explored; candidates skipped by the bound read from
the histogram of commits; capped iterations at a request's end not counted; the paired
calibration races the windows that could win on the same prompts and locks the fastest."""

import pytest
import torch

from spec_core.scd.window import WindowChooser, calibrate


def _run(ch: WindowChooser, requests: int, a: float, b: float, commits, rows: int = 2, per: int = 2) -> list[int]:
    """Drive the chooser: `requests` requests of `per` iterations; an iteration at L costs
    a + b rows L and commits commits(L) per sample. Returns each request's window."""
    out = []
    for _ in range(requests):
        out.append(ch.begin(rows))
        for _ in range(per):
            L = ch.choose(rows)
            ch.observe(L, rows, a + b * rows * L, torch.full((rows,), commits(L) - 1))
    return out


def test_explores_every_candidate_largest_first():
    ch = WindowChooser(32)
    assert ch.candidates == [32, 16, 8, 4, 2, 1]
    assert _run(ch, 6, 0.01, 0.0, lambda L: 1) == [32, 16, 8, 4, 2, 1]  # any could win: all tried
    assert ch.cost.ready and set(ch.expected_commits()) == set(ch.candidates)
    assert ch.chosen == [L for L in ch.candidates for _ in range(2)]  # one window per request


def test_free_forward_length_picks_the_largest_window():
    ch = WindowChooser(16, reexplore=1000)
    assert _run(ch, 20, 0.01, 0.0, lambda L: 1 + L // 4)[-10:] == [16] * 10


def test_dear_tokens_and_rare_acceptance_pick_ar():
    ch = WindowChooser(16, reexplore=1000)
    assert _run(ch, 20, 0.001, 0.01, lambda L: 1 + (L > 8))[-10:] == [1] * 10


def test_optimum_between():
    """Every sample commits min(L, 4) tokens: with a real intercept and slope, L = 4 (longer
    windows pay for rows that commit nothing)."""
    ch = WindowChooser(16, reexplore=1000)
    assert _run(ch, 20, 0.01, 0.001, lambda L: min(L, 4))[-10:] == [4] * 10
    assert ch.expected_commits()[16] == pytest.approx(4.0) and ch.best(2) == 4


def test_reexplores_the_neighbours_of_the_best():
    ch = WindowChooser(16, reexplore=4)
    chosen = _run(ch, 60, 0.01, 0.001, lambda L: min(L, 4))
    assert set(chosen[5:]) == {2, 4, 8}  # after the first requests: the best and its neighbours
    assert chosen[5:].count(4) > 40


def test_capped_iterations_are_not_counted():
    ch = WindowChooser(8)
    assert ch.begin(1) == 8
    L = ch.choose(1, cap=3)  # 3 tokens left: L = 3, not the request's 8
    assert L == 3
    ch.observe(L, 1, 0.01, torch.tensor([2]), left_B=torch.tensor([3]))
    assert ch.expected_commits() == {}
    ch.observe(ch.choose(1), 1, 0.01, torch.tensor([7]), left_B=torch.tensor([100]))
    assert ch.expected_commits() == {8: 8.0}


def test_max_window_one_is_ar():
    ch = WindowChooser(1)
    assert ch.candidates == [1] and ch.begin(4) == 1 and [ch.choose(4) for _ in range(5)] == [1] * 5
    ch.observe(1, 4, 0.01, torch.zeros(4, dtype=torch.long))
    assert ch.stats()["mean_window"] == 1.0


def test_estimates_never_fall_with_the_window():
    """A longer window commits at least what a shorter one does from the same state: a dip is
    noise, so it is lifted; with free length, ties go to the longer window."""
    ch = WindowChooser(32, reexplore=1000)
    _run(ch, 6, 0.01, 0.0, lambda L: 3 if L in (8, 16) else 1)
    assert ch.expected_commits() == {4: 1.0, 8: 3.0, 16: 3.0, 32: 3.0}  # 2 and 1 cannot win
    assert ch.best(2) == 32


def test_skips_windows_that_cannot_win():
    """Free length and 5 tokens per iteration at 16: a window of 4 commits at most 4 per
    iteration at the same cost, so it is never tried (nor 2, nor 1)."""
    ch = WindowChooser(16, reexplore=1000)
    assert set(_run(ch, 10, 0.01, 0.0, lambda L: min(L, 5))) == {16, 8}


def test_the_bound_reads_the_histogram_of_commits():
    """Half the samples commit 1 per iteration at 16, half 9 (mean 5). One window's timings say
    nothing of the slope, so every shorter window is still worth a try; at 8 (commits 1 and 8) the
    cost line is known: 8 commits 4.5 per 18 ms, and a window of 4 at most E[min(k, 4)] = 2.5 per
    14 ms (not min(4, 4.5) = 4), which cannot win, so 4 is never run, nor 2 or 1, and the chooser
    says it is no longer exploring."""
    ch = WindowChooser(16, reexplore=1000)
    rows, a, b = 2, 0.01, 0.0005
    assert ch.exploring(rows)
    assert ch.begin(rows) == 16
    for _ in range(2):  # sample 0 commits 1, sample 1 commits 9
        ch.observe(ch.choose(rows), rows, a + b * rows * 16, torch.tensor([0, 8]))
    assert ch.commit_bound(4) == pytest.approx(2.5) and ch.commit_bound(8) == pytest.approx(4.5)
    assert ch.commit_bound(16) == pytest.approx(5.0)
    assert ch.worth_trying(rows) == [8, 4, 2, 1]  # the slope is not known yet
    assert ch.begin(rows) == 8
    for _ in range(2):  # 8 commits min(k, 8)
        ch.observe(ch.choose(rows), rows, a + b * rows * 8, torch.tensor([0, 7]))
    assert ch.cost.verify_s(8) == pytest.approx(a + b * 8)
    assert not ch.exploring(rows) and ch.iters[4] == 0
    assert [ch.begin(rows) for _ in range(4)] == [8] * 4


def test_measured_iteration_times_beat_a_line_fitted_through_them():
    """Forward costs that are not a line (32: 30 ms, 16: 16 ms, 8: 15 ms, 4: 14.5 ms at 2 rows)
    and commits 6 / 5 / 4 / 3: the best rate is 16's (312 tokens/s against 8's 267), while a line
    fitted through the four would rank 8 first. The chooser reads each window's measured time."""
    cost = {32: 0.030, 16: 0.016, 8: 0.015, 4: 0.0145, 2: 0.014, 1: 0.014}
    commits = {32: 6, 16: 5, 8: 4, 4: 3, 2: 2, 1: 1}
    ch = WindowChooser(32, reexplore=1000)
    rows, out = 2, []
    for _ in range(8):
        out.append(ch.begin(rows))
        for _ in range(3):
            L = ch.choose(rows)
            ch.observe(L, rows, cost[L], torch.full((rows,), commits[L] - 1))
    a, b = ch.cost.coefficients()
    line = {c: commits[c] / (a + b * rows * c) for c in (16, 8)}
    assert line[8] > line[16]  # the line alone would pick 8
    assert ch.best(rows) == 16 and out[-3:] == [16] * 3
    assert ch.iteration_s(16, rows) == pytest.approx(0.016)


def test_a_few_stalled_iterations_do_not_decide_the_window():
    """16 commits 5 per 16 ms iteration, 8 commits 4 per 15 ms (16 is the faster window), but one
    iteration in eight at 16 is stalled 20x by a neighbour: its mean time (54 ms) would rank 8
    first, the median of its iterations keeps 16."""
    cost = {32: 0.030, 16: 0.016, 8: 0.015, 4: 0.0145, 2: 0.014, 1: 0.014}
    commits = {32: 6, 16: 5, 8: 4, 4: 3, 2: 2, 1: 1}
    ch = WindowChooser(32, reexplore=1000)
    rows, n = 2, 0
    for _ in range(8):
        ch.begin(rows)
        for _ in range(8):
            L = ch.choose(rows)
            n += 1
            stalled = L == 16 and n % 8 == 0
            ch.observe(L, rows, cost[L] * (20 if stalled else 1), torch.full((rows,), commits[L] - 1))
    mean16 = sum(sec for sec, _ in ch.timed[16]) / len(ch.timed[16])
    assert commits[16] / mean16 < commits[8] / cost[8]  # a mean would pick 8
    assert ch.iteration_s(16, rows) == pytest.approx(0.016, rel=0.05) and ch.best(rows) == 16


def _decoder(ch: WindowChooser, rows: int, seconds, calls: list):
    """run(L, p) of a worker: a request at the chooser's window (calibrate sets next_window) whose
    iterations cost COST[L] and commit COMMITS[L] (what the chooser learns from); the request's
    seconds are seconds(L, p)."""
    def run(L: int, p: int) -> float:
        assert ch.begin(rows) == L
        for _ in range(3):
            ch.observe(ch.choose(rows), rows, COST[L], torch.full((rows,), COMMITS[L] - 1))
        calls.append((L, p))
        return seconds(L, p)
    return run


COST = {64: 0.040, 32: 0.020, 16: 0.012, 8: 0.010, 4: 0.009, 2: 0.009, 1: 0.009}
COMMITS = {64: 7, 32: 6, 16: 4, 8: 3, 4: 2, 2: 2, 1: 1}


def test_calibrate_races_on_the_same_prompts_and_locks_the_fastest():
    """Prompts differ by up to 2x and one window is 10% faster on every one: paired, three prompts
    say so; prompt 0 runs whatever could win, largest first."""
    ch, calls = WindowChooser(64, reexplore=1000), []
    prompt = [1.0, 2.0, 0.7, 1.5, 1.2, 0.9, 1.1, 1.3]
    ratio = {32: 1.0, 16: 1.1, 64: 1.3}
    L, times = calibrate(ch, 2, _decoder(ch, 2, lambda L, p: prompt[p] * ratio.get(L, 2.0), calls), prompts=8)
    assert L == 32 and ch.locked == 32 and ch.begin(2) == 32
    assert max(p for _, p in calls) == 2  # decided after 3 prompts
    assert [c for c, p in calls if p == 0][:3] == [64, 32, 16]  # prompt 0: whatever could win
    assert len(times[32]) == 3


@pytest.mark.parametrize("gap, scale, stop", [(0.97, 1.0, None), (0.999, 0.0, 2)])
def test_calibrate_needs_more_prompts_for_a_close_pair_and_stops_when_equal(gap, scale, stop):
    """16 is 3% faster than 32 with 4% noise per prompt (the ratio is not clear after 3 prompts:
    the race goes on, and 16 wins on the total); two windows within 0.1% on every prompt are the
    same choice, so the race stops at the first cut."""
    noise = [0.04, -0.03, -0.02, 0.05, -0.04, 0.01, 0.02, -0.03, 0.0, 0.03]
    ratio = {32: 1.0, 16: gap}
    ch, calls = WindowChooser(64, reexplore=1000), []

    def seconds(L, p):
        return (1 + 0.5 * (p % 3)) * ratio.get(L, 3.0) * (1 + (scale * noise[p] if L == 16 else 0))
    L, _ = calibrate(ch, 2, _decoder(ch, 2, seconds, calls), prompts=10)
    if stop is None:
        assert L == 16 and max(p for _, p in calls) > 2
    else:
        assert max(p for _, p in calls) == stop


def test_calibrate_unpaired_luck_would_pick_the_slower_window():
    """The oracle of pairing: the fastest window run on the slowest prompts. Compared over
    different prompts (16 on prompts 0-3, 32 on 4-7) 32 would look faster; on the same prompts 16
    wins."""
    prompt = [2.0, 2.1, 1.9, 2.2, 1.0, 1.1, 0.9, 1.0]
    ratio = {16: 0.9, 32: 1.0}
    unpaired = {16: sum(prompt[:4]) * 0.9, 32: sum(prompt[4:]) * 1.0}
    assert min(unpaired, key=unpaired.get) == 32
    ch, calls = WindowChooser(64, reexplore=1000), []
    L, _ = calibrate(ch, 2, _decoder(ch, 2, lambda L, p: prompt[p] * ratio.get(L, 3.0), calls), prompts=8)
    assert L == 16


def test_a_locked_chooser_records_nothing():
    ch = WindowChooser(16)
    ch.lock(2, 8)
    assert ch.begin(2) == 8 and ch.choose(2, cap=5) == 5
    ch.observe(5, 2, 0.01, torch.tensor([3, 4]))
    assert ch.expected_commits() == {} and not ch.cost.ready
    with pytest.raises(ValueError, match="candidate"):
        ch.lock(2, 12)
