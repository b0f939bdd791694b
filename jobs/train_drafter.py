"""Train a drafter on precomputed artifacts: Ray Train + DeepSpeed ZeRO-2. `drafter.kind`:
fovea (the feature drafter family: FOVEA, or with visual_correction false and visual_context
fused / prefix / compressed the EAGLE-2-, MSD- and ViSpec-style interfaces) or medusa (Medusa-1
heads on the frozen target's states).

    python jobs/train_drafter.py --config manifests/jobs/train_drafter.yaml [--set compute.num_workers=2]

artifacts (jobs/precompute.py; checked against target.path first) -> Ray Data stream ->
TorchTrainer workers (jobs._train_drafter.loop: DeepSpeed ZeRO-2, AdamW (0.9, 0.95), WarmupDecayLR,
clip 0.5, bf16 where supported) -> checkpoints every N steps in <run>/checkpoints/ (local or
s3://) -> the drafter in <run>/drafter/, per-step metrics in <run>/train_log.jsonl. Rerunning the
same config resumes from the latest checkpoint (Ray Train V2: same RunConfig name and storage).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import ClassVar, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

from pydantic import Field, model_validator  # noqa: E402

from jobs.lib.config import Strict, with_fields_of  # noqa: E402
from jobs.lib.job import JobConfig, TargetSection, run_job  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.model_cache import model_identity  # noqa: E402
from jobs.lib.run_key import fingerprint, open_run  # noqa: E402
from jobs.lib.storage import Storage, join, scheme_of  # noqa: E402
from spec_core.fovea.config import FoveaConfig, LossConfig  # noqa: E402
from spec_core.medusa import MedusaConfig  # noqa: E402

_MEDUSA = {f.name: f.default for f in dataclasses.fields(MedusaConfig)}


class DataSection(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"cpus_per_task", "cache"})

    artifacts: str = Field("runs/precompute/reference/artifacts", description="a precompute run's artifacts/, any URI")
    shuffle_buffer: int = Field(256, ge=0, description="rows in each worker's local shuffle buffer (0: none)")
    cpus_per_task: float = Field(0.5, gt=0, description="CPUs of each Ray Data read/attach task")
    cache: bool = Field(False, description="read the artifacts once into Ray's object store (small sets)")
    on_bad_shard: Literal["fail", "skip"] = Field("fail", description="a shard whose files do not match its "
                                                  "marker: fail (one line, before training) | skip (train on the "
                                                  "rest; the report lists it and the samples it took)")


class _DrafterExtras(Strict):
    """What the `drafter` section holds beside spec_core.fovea.FoveaConfig's fields (added below,
    declared there once): the kind, and Medusa's heads (spec_core.medusa.MedusaConfig)."""

    kind: Literal["fovea", "medusa"] = "fovea"
    medusa_heads: int = Field(_MEDUSA["num_heads"], description="kind medusa: heads (MMSpec Table 6: depth 3)")
    medusa_layers: int = Field(_MEDUSA["num_layers"], description="kind medusa: ResBlocks per head")

    def fovea_config(self) -> FoveaConfig:
        return FoveaConfig(**self.model_dump(exclude={"kind", "medusa_heads", "medusa_layers"}))

    def medusa_config(self) -> MedusaConfig:
        return MedusaConfig(num_heads=self.medusa_heads, num_layers=self.medusa_layers)

    @model_validator(mode="after")
    def _checked(self):  # the dataclasses' own checks, as validation errors (exit 2)
        self.fovea_config(), self.medusa_config()
        return self

    @property
    def steps_logged(self) -> int:
        """Entries of the per-step top-1 log: draft steps, or Medusa heads."""
        return self.medusa_heads if self.kind == "medusa" else self.train_depth


DrafterSection = with_fields_of(FoveaConfig, _DrafterExtras, "DrafterSection", __name__)


class TrainSection(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"checkpoint_every", "keep_checkpoints"})

    epochs: int = Field(12, ge=1)
    per_device_batch: int = Field(4, ge=1)
    grad_accum: int = Field(1, ge=1)
    lr: float = Field(5e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(0.5, gt=0)
    warmup_steps: int | None = Field(None, ge=0, description="None: 10% of the optimizer updates")
    warmup_type: Literal["linear", "log"] = "linear"
    seed: int = 42
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    optimizer: Literal["torch", "deepspeed"] = "torch"
    max_steps: int | None = Field(None, ge=1)
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(100, ge=0, description="optimizer steps; 0: only the final checkpoint")
    keep_checkpoints: int = Field(2, ge=1)


class ComputeSection(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"cpus_per_worker", "gpus_per_worker", "max_failures"})

    num_workers: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    max_failures: int = Field(0, ge=-1, description="Ray Train restarts from the latest checkpoint; -1: forever")


class TrainDrafterConfig(JobConfig):
    data: DataSection = DataSection()
    target: TargetSection = TargetSection()
    drafter: DrafterSection = DrafterSection()
    loss: LossConfig = LossConfig()
    train: TrainSection = TrainSection()
    compute: ComputeSection = ComputeSection()


def main(cfg: TrainDrafterConfig) -> dict:
    from jobs._train_drafter.data import check_target, open_artifacts
    from jobs.lib.ray_setup import init_ray
    from jobs._train_drafter.loop import make_trainer, plan_steps
    t, c = cfg.train, cfg.compute
    need = c.num_workers * c.cpus_per_worker + cfg.data.cpus_per_task
    if cfg.ray.num_cpus is not None and not (cfg.ray.address or os.environ.get("RAY_ADDRESS")) and cfg.ray.num_cpus < need:
        raise ValueError(f"ray.num_cpus={cfg.ray.num_cpus} cannot hold {c.num_workers} worker(s) x {c.cpus_per_worker} "
                         f"CPU plus a data task of {cfg.data.cpus_per_task}: the job would wait forever")
    store, run_dir = Storage(cfg.storage), cfg.run_dir("train_drafter")
    work = cfg.model_copy(deep=True)  # what the workers get: a local target path made absolute
    if scheme_of(cfg.target.path) == "file":  # s3://: each worker's node downloads it (jobs.lib.model_cache)
        work.target.path = str(Path(cfg.target.path).resolve())
    art = open_artifacts(store, cfg.data.artifacts, cfg.data.on_bad_shard)  # bad artifacts or another target: stop here
    check_target(art, model_identity(store, work.target.path))
    plan = plan_steps(art.n_samples, c.num_workers, t.per_device_batch, t.grad_accum, t.epochs, t.max_steps,
                      t.warmup_steps)
    open_run(cfg, "train_drafter", store, {"target": fingerprint(store, work.target.path),
                                           "artifacts": fingerprint(store, join(cfg.data.artifacts, "index.json"))})
    rec = RunRecorder("train_drafter", cfg, run_dir, store)
    if art.quarantined:  # data.on_bad_shard: skip
        rec.figure("quarantined_shards", art.quarantined)
        rec.count("samples_quarantined", art.lost_samples)
    rec.figure("ray", init_ray(cfg.ray)["mode"])
    trainer = make_trainer(work, plan, art, store, run_dir)
    with rec.stage("train") as st:
        result = trainer.fit()
        st["items"] = plan.total_steps
    return finish(rec, store, run_dir, result, plan, art.n_samples)


def finish(rec: RunRecorder, store: Storage, run_dir: str, result, plan, n_samples: int) -> dict:
    """The drafter and the step log out of the final checkpoint; headline figures."""
    from jobs.lib.metrics import actor_device
    from jobs._train_drafter.loop import summarize

    ckpt = join(run_dir, "checkpoints", Path(result.checkpoint.path).name)
    state = json.loads(store.read_text(join(ckpt, "state.json")))
    for uri in store.walk_files(join(ckpt, "drafter")):
        store.write_bytes(join(run_dir, "drafter", uri.rsplit("/", 1)[-1]), store.read_bytes(uri))
    store.write_text(join(run_dir, "train_log.jsonl"), "".join(json.dumps(h) + "\n" for h in state["history"]))
    t = rec.cfg.train
    rec.count("samples", n_samples)
    rec.figure("steps", state["step"])
    rec.figure("resumed_from_step", state["resumed_from"][-1] if state["resumed_from"] else None)
    rec.figure("workers", plan.world)
    rec.figure("global_batch", t.per_device_batch * t.grad_accum * plan.world)
    for name, value in summarize(state["history"]).items():
        rec.figure(name, value)
    rec.figure("checkpoint", ckpt)
    rec.figure("drafter_uri", join(run_dir, "drafter"))
    c, start = rec.cfg.compute, state["resumed_from"][-1] if state["resumed_from"] else 0
    mine = [h for h in state["history"] if h["step"] > start]  # this run's step log (every rank in step)
    kind, per_worker = actor_device(c.gpus_per_worker, c.cpus_per_worker)
    rec.device_time("train", sum(h["seconds"] for h in mine) * plan.world, per_worker, kind, actors=plan.world,
                    samples=(state["step"] - start) * t.per_device_batch * t.grad_accum * plan.world,
                    tokens=sum(h["tokens"] for h in mine),
                    note="busy: the step log's seconds x workers (start-up and export excluded); samples and "
                         "tokens trained on, epochs counted")
    return rec.finish()


def summary(cfg: TrainDrafterConfig, m: dict) -> list[str]:
    f = m["figures"]
    return [f"{f['steps']} steps, loss {f.get('first_loss')} -> {f.get('final_loss')}, top1 per depth "
            f"{f.get('top1_per_depth')}, {f.get('tokens_per_s')} tok/s -> {f['drafter_uri']}"]


if __name__ == "__main__":  # bad artifacts, a mismatched or missing target: one line, exit 1, before any training
    run_job("train_drafter", summary, ValueError, FileNotFoundError, PermissionError, ConnectionError)
