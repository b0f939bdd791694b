"""Run records: every job writes `config.yaml`, `metrics.json` and `report.md` into its run dir.

metrics.json holds wall time per stage, throughput, counts of processed / rejected items, the
config hash, the git commit, package versions and the hardware, and a `cost` block: device-seconds
(GPU-seconds where the actors hold GPUs, CPU-seconds otherwise) per stage and in total, per 1,000
samples and per million tokens, from the busy time a job declares with `RunRecorder.device_time`,
beside the allocation bound (wall time x actors x devices), and money where `cost.price_per_device_hour`
is set.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, UTC
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar
from collections.abc import Iterable, Iterator

from pydantic import BaseModel
from tqdm.auto import tqdm

from jobs.lib.config import config_hash, config_yaml
from jobs.lib.storage import Storage, join

PACKAGES = ("spec-core", "torch", "transformers", "ray", "deepspeed", "pyarrow", "s3fs",
            "datasets", "pydantic", "numpy")
T = TypeVar("T")
KINDS = ("gpu", "cpu")
# what a stage declares; the rest of a cost entry is derived from these (and the prices)
DECLARED = ("device_kind", "basis", "devices_per_actor", "actors", "busy_seconds", "wall_seconds",
            "samples", "tokens", "note")
PLOT_LOCK = threading.Lock()  # matplotlib (its text parser) is not thread-safe: jobs may run in threads
WALL_NOTE = "no busy time measured: 1 CPU x the stage's wall time, an estimate (parallel Ray tasks are not counted)"


def fmt(x: float | None, spec: str = ".2f") -> str:
    """A figure in a report's table: '-' where there is none."""
    return "-" if x is None else format(x, spec)


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


def actor_device(num_gpus: float, num_cpus: float) -> tuple[str, float]:
    """(device kind, devices per actor) of an actor's resources: its GPUs when it holds any (a
    fraction counts as that fraction), else its CPUs."""
    return ("gpu", float(num_gpus)) if num_gpus > 0 else ("cpu", float(num_cpus))


class RunRecorder:
    """Collects stage timings, counts and figures of one job run and writes them at the end."""

    def __init__(self, job: str, cfg: BaseModel, run_dir: str, storage: Storage):
        self.job, self.cfg, self.run_dir, self.storage = job, cfg, run_dir, storage
        self.started = time.time()
        self.stages: dict[str, dict[str, float]] = {}
        self.counts: dict[str, int] = {}
        self.figures: dict[str, Any] = {}
        self.details: dict[str, Any] = {}
        self.devices: dict[str, dict[str, Any]] = {}
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

    def device_time(self, stage: str, busy_seconds: float, devices_per_actor: float, kind: str, *,
                    actors: int = 1, samples: int | None = None, tokens: int | None = None,
                    wall_seconds: float | None = None, basis: str = "busy", note: str = "") -> None:
        """Declare a stage's device use for the cost block. `busy_seconds`: the actors' measured busy
        time, summed over them; each actor holds `devices_per_actor` devices of `kind` ("gpu" | "cpu"),
        a GPU fraction counting as that fraction. `wall_seconds` (default: the stage's timed seconds)
        x `actors` x devices per actor is the allocation bound. `tokens`: generated tokens (processed
        ones for precompute and training). Stages are taken to hold distinct samples: the total adds
        them up (a pipeline declares its samples on one stage). basis "wall": busy_seconds is itself
        a wall-clock estimate."""
        if kind not in KINDS:
            raise ValueError(f"device kind must be one of {KINDS}, not {kind!r}")
        if min(busy_seconds, devices_per_actor, actors) < 0:
            raise ValueError(f"stage {stage}: busy seconds, devices per actor and actors must be >= 0")
        if wall_seconds is None and stage in self.stages:
            wall_seconds = self.stages[stage]["seconds"]
        self.devices[stage] = {"device_kind": kind, "basis": basis, "devices_per_actor": float(devices_per_actor),
                               "actors": int(actors), "busy_seconds": round(float(busy_seconds), 3),
                               "wall_seconds": wall_seconds, "samples": samples, "tokens": tokens,
                               **({"note": note} if note else {})}

    def include_cost(self, stage: str, child: dict[str, Any]) -> None:
        """The device time a nested run declared (its metrics, e.g. benchmark's generate runs) as
        this run's `stage` (`stage/<its stage>` when it has several)."""
        entries = child.get("cost", {}).get("stages", {})
        for name, e in entries.items():
            self.devices[stage if len(entries) == 1 else f"{stage}/{name}"] = {k: e[k] for k in DECLARED if k in e}

    def prices(self) -> dict[str, float | None]:
        cost = getattr(self.cfg, "cost", None)  # JobConfig.cost; a bare model has no prices
        return cost.price_per_device_hour.model_dump() if cost is not None else dict.fromkeys(KINDS)

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
            "started_utc": datetime.fromtimestamp(self.started, UTC).isoformat(),
            "wall_seconds": round(time.time() - self.started, 3),
            "stages": self.stages,
            "counts": self.counts,
            "figures": self.figures,
            **({"details": self.details} if self.details else {}),
            # a job that declares no device time: each stage as 1 CPU for its wall time (an estimate)
            "cost": cost_block(self.devices or {
                name: {"device_kind": "cpu", "basis": "wall", "devices_per_actor": 1.0, "actors": 1,
                       "busy_seconds": s["seconds"], "wall_seconds": s["seconds"], "samples": s.get("items"),
                       "tokens": None, "note": WALL_NOTE} for name, s in self.stages.items()}, self.prices()),
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


def cost_block(declared: dict[str, dict], prices: dict[str, float | None]) -> dict[str, Any]:
    """metrics.json's `cost`: each declared stage and the total with device-seconds (busy x devices
    per actor), the allocation bound (wall x actors x devices per actor), both per 1,000 samples and
    per million tokens where known, and money where the kind has a price per device-hour. Stages of
    different kinds: the total is per kind (`by_kind`), plus the summed cost when all are priced."""
    stages = {}
    for name, d in declared.items():
        wall = d.get("wall_seconds")
        alloc = None if wall is None else wall * d["actors"] * d["devices_per_actor"]
        stages[name] = {**d, **_rates(d["device_kind"], d["busy_seconds"] * d["devices_per_actor"], alloc,
                                      d.get("samples"), d.get("tokens"), prices)}
    by_kind = {}
    for kind in KINDS:
        mine = [d for d in declared.values() if d["device_kind"] == kind]
        if mine:
            allocs = [stages[n].get("allocated_device_seconds") for n, d in declared.items() if d["device_kind"] == kind]
            samples = [d["samples"] for d in mine if d.get("samples") is not None]
            tokens = [d["tokens"] for d in mine if d.get("tokens") is not None]
            by_kind[kind] = {"device_kind": kind, "samples": sum(samples) if samples else None,
                             "tokens": sum(tokens) if tokens else None}
            by_kind[kind].update(_rates(kind, sum(d["busy_seconds"] * d["devices_per_actor"] for d in mine),
                                        None if None in allocs else sum(allocs), by_kind[kind]["samples"],
                                        by_kind[kind]["tokens"], prices))
    if len(by_kind) == 1:
        total = next(iter(by_kind.values()))
    else:
        total = {"device_kind": "mixed" if by_kind else None, "by_kind": by_kind}
        if by_kind and all("cost" in t for t in by_kind.values()):
            total["cost"] = _sig(sum(t["cost"] for t in by_kind.values()))
    return {"price_per_device_hour": dict(prices), "stages": stages, "total": total}


def _rates(kind: str, device_s: float, alloc_s: float | None, samples: int | None, tokens: int | None,
           prices: dict[str, float | None]) -> dict[str, Any]:
    out: dict[str, Any] = {"device_seconds": round(device_s, 3)}
    if alloc_s is not None:
        out["allocated_device_seconds"] = round(alloc_s, 3)
        out["busy_fraction"] = _sig(device_s / alloc_s) if alloc_s > 0 else None
    if samples:
        out["per_1k_samples"] = _sig(1e3 * device_s / samples)
    if tokens:
        out["per_million_tokens"] = _sig(1e6 * device_s / tokens)
    price = prices.get(kind)
    if price is not None:
        out["cost"] = _sig(device_s / 3600 * price)
        if alloc_s is not None:
            out["allocated_cost"] = _sig(alloc_s / 3600 * price)
        if samples:
            out["cost_per_1k_samples"] = _sig(1e3 * device_s / 3600 * price / samples)
    return out


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def render_cost(cost: dict[str, Any]) -> list[str]:
    """report.md's Cost section: a row per stage and the total; a cost column where priced."""
    if not cost or not cost["stages"]:
        return []
    rows = list(cost["stages"].items())
    total = cost["total"]
    rows += [(f"**total** ({k})", t) for k, t in total["by_kind"].items()] if "by_kind" in total else [("**total**", total)]
    priced = any("cost" in e for _, e in rows)
    lines = ["## Cost", "", "Device-seconds: the actors' measured busy time x devices per actor (a GPU fraction counts "
             "as that fraction). Allocated: the stage's wall time x actors x devices per actor; the gap is idle "
             "allocation.", "",
             "| stage | devices (per actor x actors) | device-s | allocated (busy share) | per 1k samples | per M tokens |"
             + (" cost | cost per 1k samples |" if priced else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if priced else "")]
    for name, e in rows:
        dev = (f"{e['device_kind']} {e['devices_per_actor']:g} x {e['actors']}" if "actors" in e else e["device_kind"])
        share = f" ({e['busy_fraction']:.0%})" if e.get("busy_fraction") is not None else ""
        alloc = _num(e.get("allocated_device_seconds")) + share
        lines.append(f"| {name} | {dev} | {_num(e['device_seconds'])} | {alloc} | {_num(e.get('per_1k_samples'))} | "
                     f"{_num(e.get('per_million_tokens'))} |"
                     + (f" {_num(e.get('cost'))} | {_num(e.get('cost_per_1k_samples'))} |" if priced else ""))
    lines.append("")
    lines += [f"- {name}: {e['note']}" for name, e in cost["stages"].items() if e.get("note")]
    prices = ", ".join(f"{k} {v:g}" for k, v in cost["price_per_device_hour"].items() if v is not None)
    if priced and "cost" in total:
        tail = f", {_num(total['allocated_cost'])} allocated" if "allocated_cost" in total else ""
        lines.append(f"- cost: {_num(total['cost'])}{tail} at {prices} per device-hour")
    elif priced:
        lines.append(f"- cost: only the stages of priced kinds ({prices} per device-hour) have one")
    else:
        lines.append("- no price per device-hour set (`cost.price_per_device_hour`), so no money figures")
    return lines + [""]


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
    lines += render_cost(m.get("cost", {}))
    if notes:
        lines += [notes.rstrip(), ""]
    return "\n".join(lines)
