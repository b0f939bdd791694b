"""The cost block of metrics.json and report.md: device-seconds from declared busy time, the
allocation bound, per 1,000 samples and per million tokens, prices to money."""

from __future__ import annotations

import json

import pytest

from jobs.lib.job import JobConfig
from jobs.lib.metrics import RunRecorder, actor_device, cost_block, render_cost
from jobs.lib.run_key import computing_fields
from jobs.lib.storage import Storage

NO_PRICE = {"gpu": None, "cpu": None}


def declared(kind="gpu", busy=100.0, per_actor=0.5, actors=2, wall=80.0, samples=200, tokens=50_000, **extra):
    return {"device_kind": kind, "basis": "busy", "devices_per_actor": per_actor, "actors": actors,
            "busy_seconds": busy, "wall_seconds": wall, "samples": samples, "tokens": tokens, **extra}


def recorder(tmp_path, **cost) -> RunRecorder:
    cfg = JobConfig.model_validate({"run": {"output_uri": str(tmp_path)}, **({"cost": cost} if cost else {})})
    return RunRecorder("job", cfg, str(tmp_path / "run"), Storage())


def test_a_gpu_fraction_counts_as_that_fraction_per_1k_samples_and_per_million_tokens():
    e = cost_block({"gen": declared()}, NO_PRICE)["stages"]["gen"]
    # 100 busy s x 0.5 GPU = 50 GPU-s; allocated 80 s wall x 2 actors x 0.5 GPU = 80 GPU-s
    assert e["device_seconds"] == 50 and e["allocated_device_seconds"] == 80 and e["busy_fraction"] == 0.625
    assert e["per_1k_samples"] == 250 and e["per_million_tokens"] == 1000
    assert "cost" not in e and "allocated_cost" not in e


def test_a_price_per_device_hour_gives_the_cost():
    cost = cost_block({"gen": declared()}, {"gpu": 3.6, "cpu": None})
    e = cost["stages"]["gen"]
    assert e["cost"] == 0.05 and e["allocated_cost"] == 0.08 and e["cost_per_1k_samples"] == 0.25
    assert cost["total"]["cost"] == 0.05 and cost["total"]["device_kind"] == "gpu"


def test_unknown_samples_or_tokens_give_no_rate():
    e = cost_block({"gen": declared(samples=None, tokens=0, wall=None)}, NO_PRICE)["stages"]["gen"]
    assert e["device_seconds"] == 50 and not {"per_1k_samples", "per_million_tokens", "allocated_device_seconds"} & set(e)


def test_the_total_adds_stages_of_a_kind_and_keeps_kinds_apart():
    one = cost_block({"a": declared(), "b": declared(busy=20, per_actor=1, actors=1, wall=30, samples=50, tokens=None)},
                     NO_PRICE)["total"]
    assert one["device_seconds"] == 70 and one["allocated_device_seconds"] == 110
    assert one["samples"] == 250 and one["per_1k_samples"] == 280 and one["per_million_tokens"] == 1400
    mixed = cost_block({"a": declared(), "b": declared(kind="cpu", busy=7200, per_actor=2, actors=1, wall=None)},
                       {"gpu": 3.6, "cpu": 0.1})["total"]
    assert mixed["device_kind"] == "mixed" and mixed["by_kind"]["cpu"]["device_seconds"] == 14400
    assert "allocated_device_seconds" not in mixed["by_kind"]["cpu"]  # one stage without a wall time
    assert mixed["cost"] == pytest.approx(0.05 + 0.4)


def test_actor_device_and_bad_declarations(tmp_path):
    assert actor_device(0.25, 4) == ("gpu", 0.25) and actor_device(0, 2) == ("cpu", 2.0)
    rec = recorder(tmp_path)
    with pytest.raises(ValueError, match="device kind"):
        rec.device_time("s", 1.0, 1, "tpu")
    with pytest.raises(ValueError, match=">= 0"):
        rec.device_time("s", -1.0, 1, "gpu")


def test_finish_writes_the_cost_block_and_section_with_a_price(tmp_path):
    rec = recorder(tmp_path, price_per_device_hour={"gpu": 3.6})
    with rec.stage("gen"):
        pass
    rec.device_time("gen", 100.0, 0.5, "gpu", actors=2, samples=200, tokens=50_000, wall_seconds=80.0)
    m = rec.finish()
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["cost"] == m["cost"] and saved["cost"]["total"]["cost"] == 0.05
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Cost" in report and "| cost | cost per 1k samples |" in report
    assert "| gen | gpu 0.5 x 2 | 50 | 80 (62%) | 250 | 1000 | 0.05 | 0.25 |" in report
    assert "- cost: 0.05, 0.08 allocated at gpu 3.6 per device-hour" in report


def test_no_price_no_cost_line(tmp_path):
    rec = recorder(tmp_path)
    rec.device_time("gen", 10.0, 1, "cpu", samples=4, wall_seconds=10.0)
    m = rec.finish()
    assert m["cost"]["price_per_device_hour"] == NO_PRICE
    assert not any("cost" in e for e in [*m["cost"]["stages"].values(), m["cost"]["total"]])
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| gen | cpu 1 x 1 | 10 | 10 (100%) | 2500 |  |\n" in report
    assert "- cost:" not in report and "| cost |" not in report and "no price per device-hour set" in report


def test_a_job_that_declares_nothing_gets_a_wall_clock_estimate(tmp_path):
    rec = recorder(tmp_path)
    with rec.stage("write", items=8):
        pass
    e = rec.metrics()["cost"]["stages"]["write"]
    assert e["device_kind"] == "cpu" and e["basis"] == "wall" and "estimate" in e["note"]
    assert e["device_seconds"] == e["allocated_device_seconds"] == rec.stages["write"]["seconds"]
    assert "- write: no busy time measured" in "\n".join(render_cost(rec.metrics()["cost"]))


def test_a_nested_runs_cost_is_included_under_the_parents_stage(tmp_path):
    child = {"cost": cost_block({"generate": declared()}, NO_PRICE)}
    rec = recorder(tmp_path, price_per_device_hour={"gpu": 3.6})
    rec.include_cost("generate_t0", child)
    rec.include_cost("generate_t0.6", child)
    cost = rec.metrics()["cost"]
    assert set(cost["stages"]) == {"generate_t0", "generate_t0.6"}
    assert cost["total"]["device_seconds"] == 100 and cost["total"]["samples"] == 400
    assert cost["total"]["cost"] == 0.1  # priced by this run's config


def test_prices_do_not_change_the_run():
    a = JobConfig()
    b = JobConfig.model_validate({"cost": {"price_per_device_hour": {"gpu": 2.5, "cpu": 0.05}}})
    assert computing_fields(a) == computing_fields(b) and a.resolved_run_id() == b.resolved_run_id()
    assert not any(k.startswith("cost") for k in computing_fields(b))
