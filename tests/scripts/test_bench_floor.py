"""scripts/bench_floor.py runs end to end on a random tiny LLaVA: every method checked identical
to AR, each goodput run's choices and learning loss printed."""

import sys

from scripts import bench_floor


def test_the_floor_bench_runs_on_a_random_target(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_floor.py", "--random", "tiny", "--batch", "2", "--prompts", "3",
                                      "--max-new", "6", "--reps", "1", "--method", "fovea=untrained",
                                      "--method", "pld"])
    bench_floor.main()
    out = capsys.readouterr().out
    assert "random tiny-size LLaVA batch 2:" in out and "outputs identical to AR" in out
    for run in ("fovea goodput 6x6", "fovea goodput cpu", "pld goodput 6x6", "pld goodput cpu"):
        assert f"  {run}" in out and "of AR's time" in out, out
