"""jobs/train_drafter.py on tiny precompute artifacts: 2 Ray Train workers running DeepSpeed
ZeRO-2 on CPU (gloo). The loss decreases, checkpoints and the drafter land in S3 (moto), a killed
run resumes from its latest checkpoint at that step, and bad inputs stop it before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from jobs.lib.artifact_store import read_kind
from jobs.lib.storage import Storage, join
from jobs._train_drafter.loop import plan_steps
from jobs.train_drafter import DrafterSection, TrainDrafterConfig, main
from tests.procs import kill_session

REPO = Path(__file__).resolve().parents[2]

# A small drafter and a learning rate that shows learning within a few dozen updates.
FAST = {"drafter": {"n_blocks": 1, "k_min": 4, "k_max": 16, "correction_hidden": 32},
        "train": {"per_device_batch": 1, "lr": 2e-3, "warmup_steps": 2, "log_every": 1}}


@pytest.fixture(scope="module")
def world(tmp_path_factory, s3_server, ray_local):
    """A tiny target and its precompute artifacts over 24 samples, 5 shards. (s3_server first:
    Ray workers inherit its credentials from the environment.)"""
    from jobs.precompute import PrecomputeConfig
    from jobs.precompute import main as precompute
    from spec_core.reference.tasks import TASKS, make_split
    from spec_core.reference.vlm.build import build_target

    root = tmp_path_factory.mktemp("td")
    samples = [s for t in TASKS for s in make_split(t, 4, 0, "train")]
    build_target("tiny", str(root / "target"), samples=samples)
    rows = [{"id": s["id"], "source": s["task"], "split": "train", "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"],
             "conversation": s["conversation"]} for s in samples]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    m = precompute(PrecomputeConfig.model_validate({
        "run": {"output_uri": str(root / "runs")}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(root / "train.parquet"), "shard_size": 5},
        "target": {"path": str(root / "target")}, "compute": {"batch_size": 4}}))
    return root / "target", m["figures"]["artifacts_uri"], len(samples)


def _cfg(world, output_uri: str, drafter: dict | None = None, **train) -> TrainDrafterConfig:
    target, art, _ = world
    return TrainDrafterConfig.model_validate({
        "run": {"output_uri": output_uri}, "ray": {"num_cpus": 2},
        "data": {"artifacts": art, "shuffle_buffer": 8}, "target": {"path": str(target)},
        "drafter": {**FAST["drafter"], **(drafter or {})}, "train": {**FAST["train"], **train},
        "compute": {"num_workers": 2, "cpus_per_worker": 0.5}})


@pytest.mark.slow  # its subprocess imports torch and transformers before it reads the config: ~8 s
def test_the_drafter_and_loss_sections_are_spec_cores_configs():
    """Declared once: the sections take spec_core's fields and defaults, and the dataclasses' own
    checks are config errors (exit 2, naming the section) like a misspelt key."""
    from jobs.lib.config import ConfigError, load_config
    from spec_core.fovea import FoveaConfig, LossConfig
    from spec_core.medusa import MedusaConfig

    cfg = TrainDrafterConfig()
    assert cfg.drafter.fovea_config() == FoveaConfig() and cfg.loss == LossConfig()
    assert cfg.drafter.medusa_config() == MedusaConfig()
    assert DrafterSection(kind="medusa", medusa_heads=2).medusa_config() == MedusaConfig(num_heads=2)
    for override, message in (("drafter.rho=2", "invalid value 'drafter'.*rho must be in"),
                              ("drafter.medusa_heads=0", "invalid value 'drafter'.*num_heads must be >= 1"),
                              ("drafter.rhoo=0.5", "unknown field 'drafter.rhoo'"),
                              ("loss.betaa=1", "unknown field 'loss.betaa'"),
                              ("loss.beta_h=x", "invalid value 'loss.beta_h'")):
        with pytest.raises(ConfigError, match=message):
            load_config(TrainDrafterConfig, None, [override])
    r = subprocess.run([sys.executable, "jobs/train_drafter.py", "--set", "drafter.rho=2"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "rho must be in (0, 1]" in r.stderr


def test_a_local_cluster_too_small_for_workers_and_data_is_refused(tmp_path):
    cfg = TrainDrafterConfig.model_validate({"run": {"output_uri": str(tmp_path)}, "ray": {"num_cpus": 1},
                                             "compute": {"num_workers": 1, "cpus_per_worker": 1}})
    with pytest.raises(ValueError, match="would wait forever"):
        main(cfg)


def test_plan_counts_updates_per_epoch():
    p = plan_steps(24, world=2, per_device=2, accum=2, epochs=3, max_steps=None, warmup_steps=None)
    assert (p.micro_per_epoch, p.steps_per_epoch, p.total_steps, p.warmup_steps) == (6, 3, 9, 1)
    assert plan_steps(25, 2, 3, 1, 2, max_steps=5, warmup_steps=9).total_steps == 5
    with pytest.raises(ValueError, match="do not fill one optimizer update"):
        plan_steps(7, 2, 2, 2, 1, None, None)


def test_a_drafter_carries_the_top1_per_draft_step_of_its_last_records():
    """The figures saved with a drafter (the goodput policy's prior): the step log's top-1 per
    draft step over its last 10% of records, up to the first step never supervised."""
    from jobs._train_drafter.loop import acceptance_figures

    history = [{"step": i, "loss": 1.0, "top1": [0.1 * i, 0.05 * i, None], "seconds": 1.0, "tokens": 1,
                "updates": 1, "k_read": [1, 1, None]} for i in range(1, 11)]
    assert acceptance_figures(history) == [1.0, 0.5]  # the last record of ten
    assert acceptance_figures([{**history[0], "top1": [None, None, None]}]) is None


def test_no_warmup_starts_at_the_peak_rate():
    """train.warmup_steps 0 builds a schedule DeepSpeed accepts (it divides by the warmup steps),
    and its first update already runs at the peak learning rate."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    from jobs._train_drafter.loop import deepspeed_config

    cfg = TrainDrafterConfig.model_validate({"train": {"warmup_steps": 0, "lr": 3e-4}})
    plan = plan_steps(24, 1, 2, 1, 1, None, cfg.train.warmup_steps)
    params = deepspeed_config(cfg, plan, "fp32")["scheduler"]["params"]
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    sched = WarmupDecayLR(opt, **params)
    assert abs(sched.get_lr()[0] - 3e-4) < 1e-12


@pytest.mark.slow
@pytest.mark.ray
def test_ray_dataset_attaches_each_rows_image(world):
    from jobs._train_drafter.data import open_artifacts, training_dataset

    _, art_uri, n = world
    store = Storage()
    art = open_artifacts(store, art_uri)
    visual = {r["image_sha256"]: r for r in read_kind(store, art_uri, "visual").to_pylist()}
    rows = training_dataset(art, store, seed=0).take_all()
    assert len(rows) == len({r["id"] for r in rows}) == n
    for r in rows:
        v = visual[r["image_sha256"]]
        assert (r["n_visual"], r["visual"]) == (v["n_visual"], v["visual"])


@pytest.mark.slow
@pytest.mark.ray
def test_two_workers_learn_and_write_checkpoints_and_drafter_to_s3(world, s3_bucket, tmp_path):
    import torch

    from spec_core.fovea import FoveaDrafter
    from spec_core.targets import load_target

    cfg = _cfg(world, f"{s3_bucket}/spec", epochs=2, checkpoint_every=4)  # 12 updates per epoch
    m = main(cfg)
    store, run = Storage(), cfg.run_dir("train_drafter")
    f = m["figures"]
    assert f["steps"] == 24 and f["workers"] == 2 and f["global_batch"] == 2 and f["resumed_from_step"] is None
    log = [json.loads(line) for line in store.read_text(join(run, "train_log.jsonl")).splitlines()]
    assert [r["step"] for r in log] == list(range(1, 25))
    first, last = sum(r["loss"] for r in log[:4]) / 4, sum(r["loss"] for r in log[-4:]) / 4
    assert last < 0.8 * first, (first, last)
    assert {"hid", "hid_final", "hid_mid", "kl", "tok", "ce", "margin"} <= set(f["final_terms"])
    assert len(f["top1_per_depth"]) == cfg.drafter.train_depth and f["tokens_per_s"] > 0
    ckpts = [n for n in store.list(join(run, "checkpoints")) if n.startswith("step-")]
    assert ckpts == ["step-00000020", "step-00000024"]  # every 4 updates, the last 2 kept
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in store.list(join(run, "checkpoints", ckpts[-1], "ds"))
    local = tmp_path / "drafter"
    local.mkdir()
    for name in store.list(join(run, "drafter")):
        (local / name).write_bytes(store.read_bytes(join(run, "drafter", name)))
    adapter = load_target(world[0])
    drafter = FoveaDrafter.from_pretrained(local, adapter)
    torch.manual_seed(cfg.train.seed)  # the workers' initial drafter
    fresh = FoveaDrafter.from_target(adapter, cfg.drafter.fovea_config())
    assert drafter.cfg == fresh.cfg and not torch.equal(drafter.fc.weight, fresh.fc.weight)  # trained
    assert torch.equal(drafter.lm_head.weight, adapter.lm_head.weight)  # frozen


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("drafter", [{"kind": "medusa", "medusa_heads": 2},
                                     {"visual_correction": False, "visual_context": "compressed"}])
def test_the_other_drafter_kinds_learn_and_load(world, tmp_path, drafter):
    """Medusa heads and a compressed-context feature drafter, through the same DeepSpeed loop."""
    import torch

    from spec_core.decoding import load_drafter
    from spec_core.fovea import FoveaDrafter
    from spec_core.medusa import MedusaHeads
    from spec_core.targets import load_target

    cfg = _cfg(world, str(tmp_path / "out"), drafter=drafter, epochs=2, checkpoint_every=0)
    f = main(cfg)["figures"]
    run = Path(cfg.run_dir("train_drafter"))
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    first, last = sum(r["loss"] for r in log[:4]) / 4, sum(r["loss"] for r in log[-4:]) / 4
    assert last < 0.9 * first, (first, last)
    assert len(f["top1_per_depth"]) == cfg.drafter.steps_logged
    adapter = load_target(world[0])
    model = load_drafter(run / "drafter", adapter)
    assert model.acceptance == tuple(f["top1_per_depth"])  # saved with it: the goodput policy's prior
    if drafter.get("kind") == "medusa":
        assert isinstance(model, MedusaHeads) and model.cfg.num_heads == 2
        assert set(f["final_terms"]) == {"ce"}
        assert not torch.equal(model.heads[0].weight, adapter.lm_head.weight)  # trained
    else:
        assert isinstance(model, FoveaDrafter) and model.compressor is not None and model.correction is None


@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_run_resumes_at_its_last_checkpoint(world, tmp_path):
    target, art, _ = world
    out = tmp_path / "out"
    sets = {"run.output_uri": out, "data.artifacts": art, "target.path": target, "ray.num_cpus": 2,
            "compute.num_workers": 2, "compute.cpus_per_worker": 0.5, "drafter.correction_hidden": 32,
            "train.epochs": 2, "train.per_device_batch": 1, "train.checkpoint_every": 4, "train.log_every": 2}
    args = [sys.executable, str(REPO / "jobs/train_drafter.py"),
            "--config", str(REPO / "manifests/jobs/train_drafter.yaml")]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "SPEC_NO_PROGRESS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    snapshot, deadline = None, time.time() + 300
    while time.time() < deadline and proc.poll() is None and snapshot is None:
        snapshot = next(out.glob("train_drafter/*/checkpoints/checkpoint_manager_snapshot.json"), None)
        time.sleep(0.2)
    kill_session(proc.pid)  # the job and its whole local Ray, actors included
    proc.wait()
    assert snapshot is not None, "no checkpoint before the deadline"
    latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]["metrics"]["step"]
    assert 4 <= latest < 24  # killed part-way (24 updates in all, 12 per epoch)
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads(next(out.glob("train_drafter/*/metrics.json")).read_text())
    assert metrics["figures"]["resumed_from_step"] == latest and metrics["figures"]["steps"] == 24
    log = [json.loads(line) for line in next(out.glob("train_drafter/*/train_log.jsonl")).read_text().splitlines()]
    assert [r["step"] for r in log] == [1, *range(2, 25, 2)]  # the first, then every 2nd; kept, none twice
    assert [r["epoch"] for r in log] == [(r["step"] - 1) // 12 for r in log]  # the data position resumed
    yaml_lr = TrainDrafterConfig.model_validate(
        yaml.safe_load((REPO / "manifests/jobs/train_drafter.yaml").read_text())).train.lr
    lr = schedule(total=24, warmup=3, max_lr=yaml_lr)  # the YAML's peak; warmup: 10% of the updates
    assert [r["lr"] for r in log] == pytest.approx([lr[r["step"]] for r in log])  # the schedule resumed too


def schedule(total: int, warmup: int, max_lr: float) -> dict[int, float]:
    """DeepSpeed's WarmupDecayLR alone: the learning rate after each update."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=max_lr)
    sched = WarmupDecayLR(opt, total_num_steps=total, warmup_min_lr=0.0, warmup_max_lr=max_lr,
                          warmup_num_steps=warmup, warmup_type="linear")
    out = {}
    for step in range(1, total + 1):
        sched.step()
        out[step] = sched.get_lr()[0]
    return out


@pytest.mark.slow
@pytest.mark.ray
def test_bad_inputs_stop_before_training_with_one_line(world, tmp_path):
    target, art, _ = world
    other = tmp_path / "other-target"
    other.mkdir()
    cfg = json.loads((target / "config.json").read_text())
    cfg["text_config"]["hidden_size"] *= 2
    (other / "config.json").write_text(json.dumps(cfg))
    (other / "model.safetensors").write_bytes(b"")  # (weights are not read before the check)
    cases = {f"data.artifacts={tmp_path / 'nope'}": f"ArtifactError: artifacts {tmp_path / 'nope'} does not exist",
             f"target.path={other}": f"ArtifactError: artifacts {art} have hidden_size"}
    for override, expected in cases.items():
        r = subprocess.run([sys.executable, str(REPO / "jobs/train_drafter.py"), "--set", f"run.output_uri={tmp_path}",
                            "--set", f"data.artifacts={art}", "--set", f"target.path={target}", "--set", override],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"train_drafter: {expected}"), r.stderr
    assert not (tmp_path / "train_drafter").exists()
