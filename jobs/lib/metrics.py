"""Run records: every job writes `config.yaml`, `metrics.json` and `report.md` into its run dir.

metrics.json holds wall time per stage, throughput, counts of processed / rejected items, the
config hash, the git commit, package versions and the hardware.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeVar

from pydantic import BaseModel
from tqdm.auto import tqdm

from jobs.lib.config import config_hash, config_yaml
from jobs.lib.storage import Storage, join

PACKAGES = ("spec-core", "torch", "transformers", "ray", "deepspeed", "pyarrow", "s3fs",
            "datasets", "pydantic", "numpy")
T = TypeVar("T")


def git_commit() -> str:
    """HEAD of the repository holding this file, with '+dirty' when it has local changes."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "python": sys.version.split()[0],
                            "cpu_count": os.cpu_count(), "machine": platform.machine()}
    try:
        info["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    if "torch" in sys.modules:  # never import torch just to describe the machine
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


class RunRecorder:
    """Collects stage timings, counts and figures of one job run and writes them at the end."""

    def __init__(self, job: str, cfg: BaseModel, run_dir: str, storage: Storage):
        self.job, self.cfg, self.run_dir, self.storage = job, cfg, run_dir, storage
        self.started = time.time()
        self.stages: dict[str, dict[str, float]] = {}
        self.counts: dict[str, int] = {}
        self.figures: dict[str, Any] = {}
        self.details: dict[str, Any] = {}
        self.hash = config_hash(cfg)
        storage.write_text(join(run_dir, "config.yaml"), config_yaml(cfg))

    @contextmanager
    def stage(self, name: str, items: int | None = None) -> Iterator[dict]:
        """Time a stage; set `rec['items']` inside to report its throughput."""
        rec: dict[str, float] = {}
        if items is not None:
            rec["items"] = items
        t0 = time.perf_counter()
        try:
            yield rec
        finally:
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            if rec.get("items"):
                rec["items_per_s"] = round(rec["items"] / max(rec["seconds"], 1e-9), 3)
            self.stages[name] = rec

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(n)

    def figure(self, name: str, value: Any) -> None:
        """A headline figure (shown in report.md and the demo summary)."""
        self.figures[name] = value

    def detail(self, name: str, value: Any) -> None:
        """A structured result kept in metrics.json only (tables the report renders itself)."""
        self.details[name] = value

    @staticmethod
    def progress(it: Iterable[T], total: int | None = None, desc: str = "") -> Iterable[T]:
        """A progress bar with ETA on stderr (off when SPEC_NO_PROGRESS=1, as the tests set)."""
        return tqdm(it, total=total, desc=desc, dynamic_ncols=True, mininterval=1.0,
                    disable=os.environ.get("SPEC_NO_PROGRESS") == "1")

    def metrics(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "run_dir": self.run_dir,
            "config_hash": self.hash,
            "started_utc": datetime.fromtimestamp(self.started, timezone.utc).isoformat(),
            "wall_seconds": round(time.time() - self.started, 3),
            "stages": self.stages,
            "counts": self.counts,
            "figures": self.figures,
            **({"details": self.details} if self.details else {}),
            "git_commit": git_commit(),
            "packages": package_versions(),
            "hardware": hardware(),
        }

    def finish(self, notes: str = "") -> dict[str, Any]:
        """Write metrics.json and report.md; returns the metrics."""
        m = self.metrics()
        self.storage.write_text(join(self.run_dir, "metrics.json"), json.dumps(m, indent=2, default=str))
        self.storage.write_text(join(self.run_dir, "report.md"), render_report(m, notes))
        return m


def render_report(m: dict[str, Any], notes: str = "") -> str:
    """A short human report of one run."""
    lines = [f"# {m['job']} run", "", f"- run dir: `{m['run_dir']}`",
             f"- config hash: `{m['config_hash']}`, git `{m['git_commit']}`",
             f"- wall time: {m['wall_seconds']:.1f} s", ""]
    if m["figures"]:
        lines += ["## Figures", "", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in m["figures"].items()] + [""]
    if m["stages"]:
        lines += ["## Stages", "", "| stage | seconds | items | items/s |", "|---|---|---|---|"]
        for name, s in m["stages"].items():
            lines.append(f"| {name} | {s['seconds']:.2f} | {s.get('items', '')} | {s.get('items_per_s', '')} |")
        lines.append("")
    if m["counts"]:
        lines += ["## Counts", "", *[f"- {k}: {v}" for k, v in m["counts"].items()], ""]
    if notes:
        lines += [notes.rstrip(), ""]
    return "\n".join(lines)
