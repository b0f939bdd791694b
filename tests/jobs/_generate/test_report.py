"""The generate report's arithmetic against hand-computed values."""

from __future__ import annotations

import pytest

from jobs._generate import report as gr


def _m(method, sid, turn, task, new, steps, latency):
    return {"method": method, "id": sid, "turn": turn, "task": task, "new_tokens": new, "steps": steps,
            "latency_s": latency}


METRICS = [
    _m("ar", "a", 0, "cap", 11, 10, 2.0), _m("ar", "b", 0, "vqa", 5, 4, 1.0), _m("ar", "b", 1, "vqa", 3, 2, 0.5),
    _m("spec", "a", 0, "cap", 11, 2, 0.5), _m("spec", "b", 0, "vqa", 5, 1, 0.5),
    # spec's turn 1 of b is missing (rejected): excluded from both sides of every ratio
]


def test_task_table_tau_and_speedup_over_common_turns():
    t = gr.task_table(METRICS, ["ar", "spec"], "ar")
    assert t["cap"]["spec"]["tau"] == pytest.approx(10 / 2)   # 10 tokens after the prefill's, 2 steps
    assert t["cap"]["spec"]["speedup"] == pytest.approx(2.0 / 0.5)
    assert t["vqa"]["spec"]["tau"] == pytest.approx(4 / 1) and t["vqa"]["spec"]["turns"] == 1
    assert t["vqa"]["spec"]["speedup"] == pytest.approx(1.0 / 0.5)
    assert t["all"]["spec"]["tau"] == pytest.approx(14 / 3) and t["all"]["spec"]["mat"] == pytest.approx(11 / 3)
    assert t["all"]["spec"]["speedup"] == pytest.approx(3.0 / 1.0)
    assert t["all"]["ar"]["tau"] == pytest.approx(1.0) and t["all"]["ar"]["turns"] == 3
    assert t["all"]["ar"]["speedup"] == pytest.approx(1.0)


def test_throughput_sums_shards_and_finds_where_the_baseline_overtakes():
    recs = [{"throughput": {"ar": {"1": {"tokens": 100, "seconds": 10.0}, "4": {"tokens": 100, "seconds": 4.0}},
                            "spec": {"1": {"tokens": 100, "seconds": 5.0}, "4": {"tokens": 100, "seconds": 5.0,
                                                                                "mismatches": 1}}}},
            {"throughput": {"ar": {"1": {"tokens": 50, "seconds": 5.0}, "4": {"tokens": 50, "seconds": 2.0}},
                            "spec": {"1": {"tokens": 50, "seconds": 2.5}, "4": {"tokens": 50, "seconds": 2.5}}}}]
    t = gr.throughput_table(recs, ["ar", "spec"], "ar")
    assert t["spec"]["1"]["tokens_per_s"] == pytest.approx(150 / 7.5) and t["spec"]["1"]["ratio"] == pytest.approx(2.0)
    assert t["spec"]["4"]["ratio"] == pytest.approx((150 / 7.5) / (150 / 6.0))
    assert t["spec"]["4"]["mismatches"] == 1
    assert gr.overtaken_at(t, "spec") == 4
    assert gr.overtaken_at(gr.throughput_table(recs[:1], ["ar", "spec"], "ar") | {"spec": {"1": {"ratio": 1.5}}},
                           "spec") is None


def test_mismatches_and_memory():
    resp = [{"method": "ar", "id": "a", "turn": 0, "response_ids": [1, 2]},
            {"method": "spec", "id": "a", "turn": 0, "response_ids": [1, 3]},
            {"method": "ok", "id": "a", "turn": 0, "response_ids": [1, 2]}]
    assert gr.mismatches(resp, ["ar", "spec", "ok"], "ar") == {"spec": 1, "ok": 0}
    recs = [{"state_bytes": {"ar": 2**20, "spec": 3 * 2**20}}, {"state_bytes": {"ar": 2**20, "spec": 2**21}}]
    mem = gr.memory_table(recs, ["ar", "spec"], "ar")
    assert mem == {"ar": {"state_mib": 1.0, "state_delta_mib": 0.0}, "spec": {"state_mib": 3.0, "state_delta_mib": 2.0}}


def test_render_and_cdf():
    t = gr.task_table(METRICS, ["ar", "spec"], "ar")
    md = gr.render(t, {"ar": {"1": {"tokens_per_s": 10.0, "ratio": 1.0}},
                       "spec": {"1": {"tokens_per_s": 20.0, "ratio": 2.0}}}, {}, {"spec": 0}, ["ar", "spec"], "ar",
                   "latency_cdf.png")
    assert "| cap | 1 | 5.00 | 4.00 | 4.00x |" in md
    assert "| 1 | 10.0 | 20.0 (2.00x) |" in md and "ahead of `ar`" in md and "![latency CDF]" in md
    assert gr.latency_cdf_png(METRICS, ["ar", "spec"])[:4] == b"\x89PNG"


def test_the_goodput_table_says_what_the_policy_chose_and_what_learning_cost():
    """Per method and batch size: the shares of AR steps, explorations and probes, and the seconds
    learning lost to AR (summed over shards) against AR's seconds for the same tokens."""
    pol = {"steps": 50, "nodes": 20, "depth": 10, "predicted_accepted": 5.0, "observed_accepted": 4.0, "ar_steps": 40,
           "explorations": 4, "probes": 1, "learning_loss_s": 0.2, "ar_equivalent_s": 5.0, "verify_ms_intercept": 1.0,
           "verify_ms_per_token": 0.1, "draft_ms_per_depth": 0.5}
    recs = [{"throughput": {"ar": {"1": {"tokens": 100, "seconds": 10.0}},
                            "spec": {"1": {"tokens": 100, "seconds": 5.0, "policy": pol}}}}] * 2
    t = gr.throughput_table(recs, ["ar", "spec"], "ar")
    assert t["spec"]["1"]["policy"]["probes"] == 2 and t["spec"]["1"]["policy"]["draft_ms_per_depth"] == 0.5
    md = gr.render(gr.task_table(METRICS, ["ar", "spec"], "ar"), t, {}, {"spec": 0}, ["ar", "spec"], "ar", None)
    assert "| 80% / 8% / 2% | 0.40 (4.0%) |" in md, md
