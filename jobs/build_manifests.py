"""Build dataset manifests: the drafter's training pool and the evaluation manifests, as Parquet.

    python jobs/build_manifests.py --config manifests/jobs/build_manifests.yaml \
        [--set data.vars.REF=runs/reference/tiny] [--set data.force=true]

Reads the dataset manifest YAML(s) named in `data.manifests` (manifests/datasets/*.yaml; ${NAME}
comes from data.vars, then the environment, then the manifest's own vars) and writes
<output_uri>/build_manifests/<run_id>/{train.parquet, eval/<source>.parquet, rejects.parquet,
manifest_report.json} (schema and protocol: jobs._build_manifests.manifests). run_id=null means
'm-<hash of the resolved manifests>'. The build is deterministic; when manifest_report.json of
the same manifests is already there the run is skipped (the sources are not re-read), and
`data.force=true` rebuilds, writing byte-identical files when the sources are unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import ClassVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python jobs/x.py` from anywhere

from pydantic import Field  # noqa: E402

from jobs.lib.checksums import mismatch  # noqa: E402
from jobs.lib.config import Strict  # noqa: E402
from jobs.lib.job import JobConfig, run_job  # noqa: E402
from jobs._build_manifests.manifests import SourceError, build, load_manifest, spec_hash  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.run_key import open_run  # noqa: E402
from jobs.lib.storage import Storage, join, run_dir, scheme_of  # noqa: E402


class DataSection(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"io_workers", "force"})

    manifests: list[str] = Field(default_factory=lambda: ["manifests/datasets/reference.yaml"],
                                 description="dataset manifest URIs; relative paths: cwd, then repo root")
    vars: dict[str, str] = Field(default_factory=lambda: {"REF": "runs/reference/small"},
                                 description="values for ${NAME} in the manifests")
    io_workers: int = Field(8, ge=1, description="threads reading and hashing images")
    force: bool = False


class BuildManifestsConfig(JobConfig):
    data: DataSection = DataSection()


def manifest_uri(uri: str) -> str:
    """A relative local path is taken from the cwd when it exists there, else from the repo root."""
    if scheme_of(uri) != "file" or "://" in uri or Path(uri).is_absolute() or Path(uri).exists():
        return uri
    return str(REPO / uri)


def _changed(store: Storage, out: str, report: dict) -> str | None:
    """What differs between a finished build's files and the sizes and checksums its report
    recorded (None: all match; a report without checksums is of an older version)."""
    if "checksums" not in report:
        return "its report records no file checksums (written by an older version)"
    for rel, want in sorted(report["checksums"].items()):
        if why := mismatch(store, join(out, rel), rel, want):
            return why
    return None


def main(cfg: BuildManifestsConfig) -> dict:
    store = Storage(cfg.storage)
    manifests = [load_manifest(manifest_uri(u), cfg.data.vars, store) for u in cfg.data.manifests]
    digest = spec_hash(manifests)
    out = run_dir(cfg.run.output_uri, "build_manifests", cfg.run.run_id or f"m-{digest}")
    open_run(cfg, "build_manifests", store, {"manifests": digest}, run_dir=out)
    rec = RunRecorder("build_manifests", cfg, out, store)
    marker = join(out, "manifest_report.json")
    done = store.exists(marker) and json.loads(store.read_text(marker)).get("spec_hash") == digest
    if done and not cfg.data.force and (why := _changed(store, out, json.loads(store.read_text(marker)))):
        print(f"build_manifests: {why}: rebuilding", file=sys.stderr)
        done = False
    if done and not cfg.data.force:
        report, skipped = json.loads(store.read_text(marker)), True
    else:
        with rec.stage("build") as st:
            report, skipped = build(manifests, out, store, cfg.data.io_workers, rec.progress), False
            st["items"] = report["totals"]["train"] + report["totals"]["eval"]
    for k in ("train", "eval", "rejected"):
        rec.count(f"rows_{k}", 0 if skipped else report["totals"][k])
    rec.figure("skipped", skipped)
    rec.figure("train_rows", report["totals"]["train"])
    rec.figure("eval_rows", report["totals"]["eval"])
    rec.figure("dropped", report["totals"]["dropped"])
    rec.figure("manifest_uri", out)
    return rec.finish()


def summary(cfg: BuildManifestsConfig, m: dict) -> list[str]:
    f = m["figures"]
    return [f"{f['train_rows']} train / {f['eval_rows']} eval rows -> {f['manifest_uri']}"
            + (" (already built)" if f["skipped"] else "")]


if __name__ == "__main__":  # a bad config or manifest: exit 2; a bad source or storage down: exit 1
    run_job("build_manifests", summary, SourceError, ConnectionError)
