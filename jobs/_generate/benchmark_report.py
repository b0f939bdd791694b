"""The benchmark job's summary in MMSpec's shape: per setting (temperature) a Table-3-like grid
(MAT and speedup per subtask and overall, every method against AR on the same samples), the mean of
per-sample speedups beside the ratio of totals, speedup against batch size, and acceptance on
high- vs low-visual steps (MMSpec Table 7); PNG plots of each.

Inputs are the generate runs' metrics rows (jobs._generate.worker.METRICS_SCHEMA) and their
throughput tables (jobs._generate.report.throughput_table).
"""

from __future__ import annotations

import io
from collections import defaultdict

import numpy as np

from jobs._generate.report import ALL
from jobs.lib.metrics import PLOT_LOCK, fmt

TASK_ORDER = ("general_vqa", "text_vqa", "captioning", "chart_vqa", "reasoning", "multi_turn")


def _sample_latency(metrics: list[dict], methods: list[str]) -> dict[str, dict[str, float]]:
    """method -> sample id -> latency summed over the sample's turns."""
    lat: dict[str, dict[str, float]] = {m: defaultdict(float) for m in methods}
    for r in metrics:
        if r["method"] in lat:
            lat[r["method"]][r["id"]] += r["latency_s"]
    return lat


def per_sample_speedup(metrics: list[dict], methods: list[str], baseline: str) -> dict[str, float | None]:
    """method -> mean over samples of (AR latency / method latency), all turns of a sample summed."""
    lat = _sample_latency(metrics, methods)
    out = {}
    for m in methods:
        ratios = [lat[baseline][i] / t for i, t in lat[m].items() if t > 0 and i in lat[baseline]]
        out[m] = sum(ratios) / len(ratios) if ratios else None
    return out


def bootstrap_speedups(metrics: list[dict], methods: list[str], baseline: str, n: int = 1000,
                       seed: int = 0) -> dict:
    """Sampling noise of the overall speedup (total AR time / total method time): resample the
    samples with replacement `n` times (all of a sample's turns together, the same resample for
    every method: paired). Returns {"interval": method -> 95% interval of its speedup, "best": the
    method of the highest speedup, "gap": method -> 95% interval of its speedup minus the best's}."""
    lat = _sample_latency(metrics, methods)
    ids = sorted(set.intersection(*(set(lat[m]) for m in methods))) if methods else []
    others = [m for m in methods if m != baseline]
    if not ids or not others:
        return {"interval": {}, "best": None, "gap": {}}
    lat_SM = np.array([[lat[m][i] for m in methods] for i in ids])
    pick_NS = np.random.default_rng(seed).integers(0, len(ids), size=(n, len(ids)))
    tot_NM = lat_SM[pick_NS].sum(axis=1)
    speed_NM = tot_NM[:, [methods.index(baseline)]] / tot_NM
    point_M = lat_SM[:, methods.index(baseline)].sum() / lat_SM.sum(axis=0)
    col = {m: methods.index(m) for m in others}
    best = max(others, key=lambda m: point_M[col[m]])
    q = lambda x: tuple(float(v) for v in np.quantile(x, [0.025, 0.975]))  # noqa: E731
    return {"interval": {m: q(speed_NM[:, col[m]]) for m in others}, "best": best,
            "gap": {m: q(speed_NM[:, col[m]] - speed_NM[:, col[best]]) for m in others if m != best}}


def visual_split(metrics: list[dict], methods: list[str], threshold: float) -> dict[str, dict]:
    """method -> {high, low}: steps (with a recorded visual share) at >= / < threshold, and the
    mean accepted drafts per step there (accept length - 1, MMSpec's MAT convention)."""
    out = {}
    for m in methods:
        acc = {"high": [], "low": []}
        for r in metrics:
            if r["method"] != m:
                continue
            for share, k in zip(r.get("visual_shares") or [], r.get("accept_lengths") or []):
                acc["high" if share >= threshold else "low"].append(k - 1)
        out[m] = {side: {"steps": len(v), "mat": sum(v) / len(v) if v else None} for side, v in acc.items()}
    return out


def _tasks(tasks: dict) -> list[str]:
    known = [t for t in TASK_ORDER if t in tasks]
    return known + sorted(t for t in tasks if t not in known and t != ALL) + ([ALL] if ALL in tasks else [])


def table3(tasks: dict, per_sample: dict, methods: list[str], baseline: str,
           interval: dict | None = None) -> list[str]:
    """Markdown: rows are methods, columns subtasks + overall, cells 'MAT speedup', then the
    overall speedup's 95% bootstrap interval and the mean per-sample speedup."""
    cols = _tasks(tasks)
    interval = interval or {}
    lines = ["| method | " + " | ".join(c if c != ALL else "**overall**" for c in cols) +
             " | overall speedup 95% | mean per-sample speedup |", "|" + "---|" * (len(cols) + 3)]
    for m in methods:
        if m == baseline:
            continue
        cells = []
        for c in cols:
            row = tasks[c].get(m, {})
            cells.append(f"{fmt(row.get('mat'))} {fmt(row.get('speedup'))}x")
        lo, hi = interval.get(m, (None, None))
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {fmt(lo)}-{fmt(hi)} | {fmt(per_sample.get(m))}x |")
    return lines


def _bars_png(groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str,
              hline: float | None = None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with PLOT_LOCK:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * max(1, len(series)) / 3), 3.8), dpi=110)
        width = 0.8 / max(1, len(series))
        for i, (name, ys) in enumerate(series.items()):
            ax.bar([g + i * width for g in range(len(groups))], [y or 0.0 for y in ys], width, label=name)
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups, rotation=20, fontsize=8)
        if hline is not None:
            ax.axhline(hline, color="gray", ls="--", lw=1)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
    return buf.getvalue()


def speedup_png(tasks: dict, methods: list[str], baseline: str, title: str) -> bytes:
    """Speedup per method (bars) and subtask (groups), AR at 1."""
    cols = _tasks(tasks)
    series = {m: [tasks[c].get(m, {}).get("speedup") for c in cols] for m in methods if m != baseline}
    return _bars_png(cols, series, "speedup over AR (batch 1)", title, hline=1.0)


def batch_png(throughput: dict, methods: list[str], baseline: str, title: str) -> bytes:
    """Throughput ratio to AR per batch size (groups) and method (bars)."""
    batches = sorted({b for m in methods for b in throughput.get(m, {})}, key=int)
    series = {m: [throughput[m].get(b, {}).get("ratio") for b in batches] for m in methods if m != baseline}
    return _bars_png([f"batch {b}" for b in batches], series, "throughput / AR's", title, hline=1.0)


def visual_png(split: dict, methods: list[str], threshold: float, title: str) -> bytes:
    """Mean accepted drafts on low- and high-visual steps per method."""
    names = [m for m in methods if split.get(m, {}).get("low", {}).get("steps")]
    series = {f"share < {threshold}": [split[m]["low"]["mat"] for m in names],
              f"share >= {threshold}": [split[m]["high"]["mat"] for m in names]}
    return _bars_png(names, series, "accepted drafts per step", title)


def render(settings: list[dict], methods: list[str], baseline: str, threshold: float) -> str:
    """report.md body: one section per setting."""
    lines = []
    for st in settings:
        lines += [f"## {st['name']}", "", f"{st['samples']} samples, {st['turns']} turns; batch 1 against "
                  f"`{baseline}` on the same samples, methods interleaved per sample. Cells: MAT (accepted "
                  "drafts per step, bonus excluded) and speedup (total AR time / total method time). "
                  f"Lossless check: {st['mismatches']} outputs differ from `{baseline}`"
                  + (" (sampling: not expected to match)" if st["sampled"] else "") + ".", ""]
        boot = st.get("bootstrap") or {}
        lines += table3(st["tasks"], st["per_sample"], methods, baseline, boot.get("interval"))
        if boot.get("best"):
            gaps = boot["gap"]
            near = [m for m, (lo, hi) in gaps.items() if lo <= 0 <= hi]
            lines += ["", f"Fastest overall: **{boot['best']}**. Speedup gap to it, 95% paired bootstrap over samples: "
                      + ", ".join(f"{m} {fmt(lo)} to {fmt(hi)}" for m, (lo, hi) in gaps.items())
                      + f". Within noise of it (interval holds 0): {', '.join(near) if near else 'none'}."]
        if st.get("vs_fastest"):
            lines += ["", f"Overall speedup against the fastest baseline, `{st['fastest']}`, on the same samples "
                      "(batch 1): " + ", ".join(f"{m} {fmt(v)}x" for m, v in st["vs_fastest"].items()) + "."]
        tau = {m: st["tasks"].get(ALL, {}).get(m, {}).get("tau") for m in methods if m != baseline}
        lines += ["", "tau (tokens per step, bonus included) overall: " +
                  ", ".join(f"{m} {fmt(v)}" for m, v in tau.items()), ""]
        batches = sorted({b for m in methods for b in st["throughput"].get(m, {})}, key=int)
        lines += ["Throughput against AR per batch size (every method runs batched on the engine):", "",
                  "| method | " + " | ".join(f"batch {b}" for b in batches) + " |", "|" + "---|" * (1 + len(batches))]
        for m in methods:
            if m != baseline:
                lines.append(f"| {m} | " + " | ".join(
                    f"{fmt(st['throughput'][m].get(b, {}).get('ratio'))}x" for b in batches) + " |")
        split = st["visual"]
        if any(split[m]["high"]["steps"] + split[m]["low"]["steps"] for m in split):
            lines += ["", f"Acceptance on high-visual (last-layer attention share on the image >= {threshold}) "
                      "and low-visual steps (MMSpec Table 7):", "",
                      "| method | low steps | low MAT | high steps | high MAT |", "|---|---|---|---|---|"]
            for m, v in split.items():
                lines.append(f"| {m} | {v['low']['steps']} | {fmt(v['low']['mat'])} | {v['high']['steps']} | "
                             f"{fmt(v['high']['mat'])} |")
        lines += [""] + [f"![{p}]({p})" for p in st["plots"]] + [""]
    return "\n".join(lines)
