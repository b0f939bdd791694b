"""jobs/benchmark.py on the tiny world: two settings (greedy and temperature 0.6), a method zoo
(AR, PLD, SAM with ViSkip, Lookahead, Recycling, Medusa heads, a FOVEA and a compressed-context
drafter), batch sizes 1 and 2 - the report
has the Table-3 grid per setting, greedy outputs equal AR's, the high/low-visual split counts
steps, plots exist; config mistakes fail before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from jobs.benchmark import BenchmarkConfig, main
from spec_core.fovea import FoveaDrafter
from spec_core.medusa import MedusaHeads
from spec_core.reference.tasks import TASKS, make_split
from spec_core.reference.vlm.build import build_target
from spec_core.targets import load_target
from tests.jobs.worlds import manifest_rows


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    train = [s for t in TASKS for s in make_split(t, 4, 0, "train")]
    build_target("tiny", str(root / "target"), samples=train)
    torch.manual_seed(0)
    target = load_target(root / "target")
    FoveaDrafter.from_target(target, n_blocks=1).save_pretrained(root / "drafter")
    FoveaDrafter.from_target(target, n_blocks=1, visual_correction=False,
                             visual_context="compressed").save_pretrained(root / "compressed")
    MedusaHeads.from_target(target).save_pretrained(root / "medusa")
    evals = [s for t in TASKS for s in make_split(t, 2, 0, "eval")]
    rows = manifest_rows(evals)
    (root / "eval").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), root / "eval" / "ref.parquet")
    return root


def _cfg(root: Path, out: Path, **extra) -> BenchmarkConfig:
    methods = {"ar": {"kind": "ar"}, "hf": {"kind": "hf"}, "pld": {"kind": "pld"},
               "sam_viskip": {"kind": "sam", "viskip": 0.35},
               "lookahead": {"kind": "lookahead"}, "recycling": {"kind": "recycling"},
               "medusa": {"kind": "medusa", "drafter": str(root / "medusa"), "tree": {"budget": 12}},
               "compressed": {"drafter": str(root / "compressed"), "tree": {"budget": 12}},
               "fovea": {"drafter": str(root / "drafter"), "tree": {"budget": 12}}}
    data = {"run": {"output_uri": str(out), "run_id": "b"}, "ray": {"num_cpus": 2},
            "data": {"manifest": str(root / "eval"), "shard_size": 6, "limit_per_source": None},
            "target": {"path": str(root / "target")}, "methods": methods, "compare": list(methods),
            "max_new_tokens": 16, "compute": {"num_actors": 2, "batch_sizes": [1, 2]}}
    return BenchmarkConfig.model_validate({**data, **extra})


def test_benchmark_report_has_every_setting_method_and_subtask(world, ray_local, tmp_path):
    m = main(_cfg(world, tmp_path))
    run_dir = Path(m["figures"]["run_dir"])
    report = (run_dir / "report.md").read_text()
    for head in ("## greedy (temperature 0)", "## sampling at temperature 0.6", "**overall**", "high MAT"):
        assert head in report
    for method in ("pld", "sam_viskip", "lookahead", "recycling", "medusa", "compressed", "fovea"):
        assert f"| {method} |" in report
        assert m["figures"][f"t0_{method}"]["speedup"] > 0
    for task in TASKS:
        assert task in report
    settings = json.loads((run_dir / "metrics.json").read_text())["details"]["settings"]
    greedy = settings[0]
    assert greedy["mismatches"] == 0 and greedy["samples"] == len(TASKS) * 2
    assert set(greedy["throughput"]["pld"]) == {"1", "2"}
    split = greedy["visual"]["fovea"]
    assert split["high"]["steps"] + split["low"]["steps"] > 0
    assert "Lossless check: 0 outputs differ" in report  # HF generate's own outputs included
    fastest = greedy["fastest"]  # of ar and hf, the one of least batch-1 latency
    assert fastest in ("ar", "hf")
    assert f"Overall speedup against the fastest baseline, `{fastest}`, on the same samples (batch 1): " in report
    assert fastest not in greedy["vs_fastest"] and {"pld", "fovea"} <= set(greedy["vs_fastest"])
    for tag in ("t0", "t0.6"):
        for plot in ("speedup", "batch", "visual", "latency_cdf"):
            assert (run_dir / f"{plot}_{tag}.png").stat().st_size > 1000
    from jobs.lib.run_key import RunMismatch

    with pytest.raises(RunMismatch, match=r"temperatures: \[0\.0, 0\.6\] -> \[0\.0\]"):  # stops before any work
        main(_cfg(world, tmp_path, temperatures=[0.0]))


def test_config_mistakes_fail_first(world, tmp_path):
    with pytest.raises(ValueError, match="not in methods"):
        _cfg(world, tmp_path, compare=["ar", "eagle3"])
    with pytest.raises(ValueError, match="distinct"):
        _cfg(world, tmp_path, temperatures=[0.0, 0.0])
    with pytest.raises(FileNotFoundError, match="not a local drafter directory"):
        main(_cfg(world, tmp_path, methods={"ar": {"kind": "ar"}, "x": {"drafter": str(tmp_path / "none")}},
                  compare=["ar", "x"]))


def test_no_room_for_a_prompt_fails_first_and_a_setting_with_every_turn_rejected_says_why(world, ray_local, tmp_path):
    """max_new_tokens that fills the target's position table (MMSpec's 1024 on a 1024-position
    target) fails before any work, naming the table; where every prompt is too long for what is
    left, the benchmark stops at that setting with the reject reason, not at a missing plot."""
    from tests.jobs.worlds import short_table_target

    short = short_table_target(world / "target", tmp_path / "short", 40)  # every prompt here is longer than 24
    methods = {"ar": {"kind": "ar"}, "pld": {"kind": "pld"}}
    with pytest.raises(ValueError, match="max_new_tokens 40 leaves no position for a prompt: the target has 40"):
        main(_cfg(world, tmp_path / "a", target={"path": short}, methods=methods, compare=list(methods),
                  max_new_tokens=40))
    assert not (tmp_path / "a" / "generate").exists()  # no generate run began
    with pytest.raises(ValueError, match=r"greedy \(temperature 0\): no usable row: all \d+ rows were rejected "
                                         r"\(commonest: beyond the position table x\d+\), e\.g\. '[\w-]+: beyond "
                                         r"the position table: \d+ tokens \+ 16 new > max_position_embeddings 40'"):
        main(_cfg(world, tmp_path / "b", target={"path": short}, methods=methods, compare=list(methods),
                  compute={"num_actors": 1, "batch_sizes": [1]}))
