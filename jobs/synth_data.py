"""Generate the reference world's six-task multimodal dataset with Ray Data, as Parquet.

    python jobs/synth_data.py --config manifests/jobs/synth_data.yaml [--set data.seed=1]
    python jobs/synth_data.py --config manifests/jobs/synth_data.yaml --set data.world=hires

Writes <output_uri>/synth_data/<run_id>/data/<split>/*.parquet (schema: jobs.lib.records).
Deterministic per (seed, split, task, index); a killed run resumes split by split.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

from pydantic import Field  # noqa: E402

from jobs.lib.checksums import folder_record, verify_folder  # noqa: E402
from jobs.lib.config import Strict  # noqa: E402
from jobs.lib.job import JobConfig, run_job  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.ray_setup import init_ray  # noqa: E402
from jobs.lib.run_key import open_run  # noqa: E402
from jobs.lib.storage import Storage, connection_errors, join  # noqa: E402

from spec_core.reference.tasks import TASKS  # noqa: E402

Task = Literal[TASKS]  # the six task kinds, validated by name


class DataSection(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"rows_per_block"})

    seed: int = 0
    world: Literal["small", "hires"] = Field(
        "small", description="small: 64 px scenes; hires: 192 px mosaics of nine panels, region questions, "
                             "six samples per image (index i of every task shares image i)")
    per_task: dict[str, int] = Field(default_factory=lambda: {"train": 200, "eval": 50},
                                     description="samples per task, per split name")
    tasks: list[Task] = Field(default_factory=lambda: list(TASKS))
    rows_per_block: int = Field(64, ge=1)


class SynthDataConfig(JobConfig):
    data: DataSection = DataSection()


def write_split(split: str, n: int, cfg: SynthDataConfig, out: str, store: Storage) -> int:
    """Generate one split into out/<split>/ unless its _SUCCESS marker is already there."""
    import ray

    from jobs.lib.records import generate_samples

    done = join(out, split, "_SUCCESS")
    if store.exists(done):
        try:
            files = json.loads(store.read_text(done)).get("files")
        except (ValueError, AttributeError):
            files = None
        why = verify_folder(store, join(out, split), "_SUCCESS", files)
        if why is None:
            return 0
        print(f"synth_data: split {split} does not match its marker ({why}): redoing it", file=sys.stderr)
    store.delete(join(out, split), recursive=True)  # a partial write from a killed run
    items = [{"split": split, "task": t, "index": i} for t in cfg.data.tasks for i in range(n)]
    blocks = max(1, len(items) // cfg.data.rows_per_block)
    ds = ray.data.from_items(items, override_num_blocks=blocks)
    ds = ds.map_batches(generate_samples, fn_kwargs={"seed": cfg.data.seed, "world": cfg.data.world},
                        batch_size=cfg.data.rows_per_block, batch_format="pyarrow")
    fs, path = store.arrow_fs(join(out, split))
    # a write task is idempotent (Ray Data names its file by write id and task index; the split is
    # cleared first and _SUCCESS written last): retried when storage drops its connection
    ds.write_parquet(path, filesystem=fs,
                     ray_remote_args={"max_retries": 3, "retry_exceptions": list(connection_errors())})
    # the commit: each file's size and sha256, checked before a rerun trusts the split
    store.write_text(done, json.dumps({"samples": len(items), "files": folder_record(store, join(out, split), "_SUCCESS")}))
    return len(items)


def main(cfg: SynthDataConfig) -> dict:
    store = Storage(cfg.storage)
    run_dir = cfg.run_dir("synth_data")
    open_run(cfg, "synth_data", store)
    rec = RunRecorder("synth_data", cfg, run_dir, store)
    info = init_ray(cfg.ray)
    rec.figure("ray", info["mode"])
    out = join(run_dir, "data")
    total = 0
    for split, n in cfg.data.per_task.items():
        with rec.stage(f"generate_{split}") as st:
            st["items"] = made = write_split(split, n, cfg, out, store)
        rec.count(f"samples_{split}", made)
        total += made
    rec.figure("samples_written", total)
    rec.figure("data_uri", out)
    return rec.finish()


def summary(cfg: SynthDataConfig, m: dict) -> list[str]:
    return [f"{m['figures']['samples_written']} samples -> {m['figures']['data_uri']}"]


if __name__ == "__main__":
    run_job("synth_data", summary, FileNotFoundError, PermissionError, ConnectionError)
