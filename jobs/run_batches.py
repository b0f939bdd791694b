"""Scheduled batches: claim the queue's pending batch requests, run each, record its status.

    python jobs/run_batches.py --config manifests/jobs/run_batches.yaml --set queue.uri=s3://bucket/queue
    ray job submit --working-dir . -- python jobs/run_batches.py --config manifests/jobs/run_batches.yaml

A request is a YAML object under <queue>/pending/<id>.yaml:

    job: generate                              # the job to run (jobs/<job>.py)
    config_file: manifests/jobs/generate.yaml  # optional base config
    set: [data.limit_per_source=100]           # optional --set overrides
    config: {data: {manifest: s3://...}}       # optional inline config (applied last)

Its run id defaults to the batch id, so a batch's outputs land in <output_uri>/<job>/<id>/ and a
rerun resumes there. Each batch is claimed with a lease (jobs._run_batches.batch_queue): two schedulers
at once, or one that died mid-batch, still process every batch exactly once. Cron or a KubeRay
RayCronJob runs this job on a schedule (cluster/kuberay/).
"""

from __future__ import annotations

import socket
import sys
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

import yaml  # noqa: E402
from pydantic import Field  # noqa: E402

from jobs._run_batches.batch_queue import BatchQueue, Renewer  # noqa: E402
from jobs.lib.config import ConfigError, Strict, apply_override, build_config, load_yaml, parse_override  # noqa: E402
from jobs.lib.job import JobConfig, job_entry, run_job  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.ray_setup import init_ray  # noqa: E402
from jobs.lib.storage import Storage, StorageUnavailable  # noqa: E402

BATCH_JOBS = ("generate", "generate_images", "benchmark")  # jobs a request may name


class QueueSection(Strict):
    uri: str = Field("runs/queue", description="the queue's root: pending/, leases/, done/, failed/")
    lease_seconds: float = Field(600.0, gt=0, description="a claimed batch is another scheduler's after this "
                                 "long without renewal (renewed every third of it)")
    max_batches: int | None = Field(None, ge=1, description="stop after this many batches in one run")


class RunBatchesConfig(JobConfig):
    queue: QueueSection = QueueSection()


def batch_config(request: dict, batch: str, defaults: JobConfig) -> tuple[str, JobConfig]:
    """A request -> (job name, its validated config). Storage and Ray sections come from the
    scheduler's config unless the request sets them; the run id defaults to the batch id."""
    job = request.get("job")
    if job not in BATCH_JOBS:
        raise ConfigError(f"config error: batch {batch}: job {job!r} is not one of {sorted(BATCH_JOBS)}")
    cls, _ = job_entry(job)
    data = load_yaml(request["config_file"]) if request.get("config_file") else {}
    # the scheduler's storage, Ray and output place; the request's own set / config win over them
    data.update(storage=defaults.storage.model_dump(), ray=defaults.ray.model_dump())
    data.setdefault("run", {})["output_uri"] = defaults.run.output_uri
    for text in request.get("set", []):
        apply_override(data, *parse_override(text))
    for key, value in (request.get("config") or {}).items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    if not data["run"].get("run_id"):  # a config file's run_id: null means "the default": the batch id
        data["run"]["run_id"] = batch
    return job, build_config(cls, data, f"batch {batch}")


def run_one(queue: BatchQueue, batch: str, defaults: JobConfig) -> dict | None:
    """Claim and run one batch; its status record, or None if it was not ours to run."""
    lease = queue.claim(batch)
    if lease is None:
        return None
    record = {"batch": batch, "owner": queue.owner, "attempt": lease.generation + 1, "started_unix": time.time()}
    state = "done"
    try:
        request = yaml.safe_load(queue.request(batch)) or {}
        job, cfg = batch_config(request, batch, defaults)
        record.update(job=job, run_dir=cfg.run_dir(job))
        _, main = job_entry(job)
        with Renewer(queue, lease) as renewer:
            m = main(cfg)
        if renewer.error is not None:
            raise renewer.error
        record.update(counts=m["counts"], wall_seconds=m["wall_seconds"],
                      figures={k: v for k, v in m["figures"].items() if not isinstance(v, (dict, list))})
    except StorageUnavailable:
        raise  # not the batch's fault: its lease expires and a later run takes it over
    except Exception as err:  # noqa: BLE001 - a failed batch is recorded; the next one runs
        state = "failed"
        record.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(limit=5))
    record.update(state=state, finished_unix=time.time())
    queue.finish(lease, state, record)
    return record


def main(cfg: RunBatchesConfig) -> dict:
    store = Storage(cfg.storage)
    owner = f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
    queue = BatchQueue(store, cfg.queue.uri, owner, cfg.queue.lease_seconds)
    rec = RunRecorder("run_batches", cfg, cfg.run_dir("run_batches"), store)
    rec.figure("ray", init_ray(cfg.ray)["mode"])
    ran: list[dict] = []
    with rec.stage("batches") as st:
        for batch in queue.pending():
            if cfg.queue.max_batches and len(ran) >= cfg.queue.max_batches:
                break
            record = run_one(queue, batch, cfg)
            if record is not None:
                ran.append(record)
                print(f"run_batches: {batch}: {record['state']}"
                      + (f" ({record['error']})" if record["state"] == "failed" else f" -> {record['run_dir']}"))
        st["items"] = len(ran)
    rec.count("done", sum(r["state"] == "done" for r in ran))
    rec.count("failed", sum(r["state"] == "failed" for r in ran))
    rec.figure("owner", owner)
    rec.figure("batches", [f"{r['batch']}: {r['state']}" for r in ran])
    return rec.finish()


def summary(cfg: RunBatchesConfig, m: dict) -> list[str]:
    return [f"{m['counts'].get('done', 0)} done, {m['counts'].get('failed', 0)} failed"]


if __name__ == "__main__":
    run_job("run_batches", summary, FileNotFoundError, PermissionError, ConnectionError)
