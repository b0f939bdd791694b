"""scripts/bench_gpu.py on the tiny size on CPU (the figures it writes; fp32 engine AR, eager and
compiled, and speculation token-identical to HF generate) and scripts/gpu_check.sh skipping cleanly
without CUDA."""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("bench_gpu", Path(REPO) / "scripts" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_cpu_run_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    load_script().main(["--device", "cpu", "--size", "tiny", "--batch", "1", "--batch", "2", "--max-new", "8",
                        "--reps", "1", "--out", str(out)])
    res = json.loads(out.read_text())
    assert (res["dtype"], res["max_new"], res["reps"]) == ("float32", 8, 1) and res["params"] > 0
    assert set(res["batches"]) == {"1", "2"}
    assert res["decode_weight_bytes"] > 0 and res["copy_bandwidth_gbs"] > 0 and res["step_limit_s"] > 0
    for b, fig in res["batches"].items():
        assert fig["requests"] == int(b) and len(fig["prompt_tokens"]) == int(b)
        for side in ("hf", "hf_compiled", "engine_ar", "engine_ar_compiled", "speculative"):
            assert fig[side]["ms_per_token"] > 0 and fig[side]["x_bandwidth_limit"] > 0 and fig["warmup_s"][side] > 0
            share = fig[side]["overhead_share"]  # timed by hooks on the eager sides only
            assert (0 <= share < 1) if side in ("hf", "engine_ar") else share is None
            assert len(fig[side]["seconds"]) == 1  # one repetition: its median is its minimum
            assert fig[side]["median_ms_per_token"] == fig[side]["ms_per_token"]
        for side in ("hf_compiled", "engine_ar", "engine_ar_compiled", "speculative"):  # fp32 on CPU: token-identical
            assert fig[side]["mismatch_vs_hf"] == 0 and fig[side]["sequences_differ_vs_hf"] == 0
        assert fig["engine_ar_compiled"]["compile"]["recompiles"] == 0 and fig["verify40_over_ar_step"] > 0
        assert "profile" not in fig
        spec = fig["speculative"]
        assert spec["mismatch_vs_engine_ar"] == 0 and spec["tokens_per_step"] >= 1
        assert spec["goodput_nodes_per_step"] >= 0 and spec["time_vs_engine_ar"] > 0


def test_profile_counts_host_work_per_token(tmp_path):
    out = tmp_path / "bench.json"
    load_script().main(["--device", "cpu", "--size", "tiny", "--batch", "2", "--max-new", "4", "--reps", "2",
                        "--profile", "--out", str(out)])
    fig = json.loads(out.read_text())["batches"]["2"]
    for side in ("hf", "hf_compiled", "engine_ar", "engine_ar_compiled", "speculative"):
        sec = fig[side]["seconds"]
        assert len(sec) == 2 and min(sec) - 1e-4 <= fig[side]["median_ms_per_token"] * 8 / 1e3 <= max(sec) + 1e-4  # rounded
        prof = fig["profile"][side]
        assert prof["kernel_launches_per_token"] == 0 and prof["host_waits_per_token"] == {}  # CPU: no CUDA runtime
        assert prof["ops_per_token"] > 10  # a 2-layer decoder runs dozens of aten ops per token
        assert 0 < len(prof["top_self_cpu_ms_per_token"]) <= 12
        assert all(k.startswith("aten::") or not k.startswith("cuda") for k in prof["top_self_cpu_ms_per_token"])


def test_mismatch_rate_is_position_wise():
    rate = load_script().mismatch_rate
    assert rate([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == 0
    assert rate([[1, 2, 3, 4], [5, 6]], [[1, 9, 3, 4], [5, 6]]) == 1 / 6
    assert rate([[1, 2]], [[1]]) == 1 / 2  # a missing token is a mismatch


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_gpu_check_skips_cleanly_without_cuda(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "skipped: no CUDA" in proc.stdout and "every GPU test and the benchmark skipped" in proc.stdout
    assert " skipped" in proc.stdout and " failed" not in proc.stdout and " passed" not in proc.stdout
    assert json.loads((tmp_path / "gpu_bench.json").read_text()) == {"skipped": "no CUDA"}
