"""The generate_images job's summary: NFE and latency acceleration against AR per method and window,
SCD against SJD, acceptance per iteration, peak memory, sample quality against AR's own noise
floor; plots (NFE vs window, acceptance curves) and a grid of samples.

Inputs are the item records (jobs._generate_images.worker). Every ratio compares the same (prompt, seed)
pairs: acceleration = mean NFE of AR / mean NFE of the method, and summed AR latency / summed
method latency (the sampling loop, prefill included). Window "auto" (L chosen per iteration) is a
row of its own after the fixed windows, with the mean L it chose; plots put it at that mean L.
"""

from __future__ import annotations

import io
import threading
from collections import defaultdict

import torch

from jobs.lib.metrics import PLOT_LOCK, fmt

KINDS = ("image", "video")
_ORDER = {"ar": 0, "sjd": 1, "scd_mc": 2, "scd_gs": 3}
_GRID_LOCK = threading.Lock()


def _wkey(window: int | str) -> tuple[int, int]:
    """Sort key of a window: the integers in order, then auto."""
    return (1, 0) if window == "auto" else (0, int(window))


def _window_label(r: dict) -> str:
    return f"auto (mean {r['mean_window']:.1f})" if r["window"] == "auto" else str(r["window"])


def _by(items: list[dict], kind: str) -> dict[tuple[str, int | str], dict[tuple[str, int], dict]]:
    """(method, window) -> (id, seed) -> record, for one kind."""
    out: dict = defaultdict(dict)
    for r in items:
        if r["kind"] == kind:
            out[(r["method"], r["window"])][(r["id"], r["seed"])] = r
    return out


def accel_table(items: list[dict], kind: str) -> list[dict]:
    """One row per (method, window): samples, mean NFE, NFE, latency (the sampling loop, prefill
    included) and end-to-end (prompt to encoded file) acceleration vs AR, NFE of
    SJD / NFE at the same window, tokens per iteration, entropy, peak memory (AR's alongside)."""
    by = _by(items, kind)
    ar = by.get(("ar", 1), {})
    rows = []
    for (m, w), recs in sorted(by.items(), key=lambda kv: (_wkey(kv[0][1]), _ORDER.get(kv[0][0], 9))):
        keys = [k for k in recs if k in ar]
        if not keys:
            continue
        nfe = sum(recs[k]["nfe"] for k in keys) / len(keys)
        ar_nfe = sum(ar[k]["nfe"] for k in keys) / len(keys)
        lat, ar_lat = sum(recs[k]["latency_s"] for k in keys), sum(ar[k]["latency_s"] for k in keys)
        e2e, ar_e2e = sum(recs[k]["e2e_s"] for k in keys), sum(ar[k]["e2e_s"] for k in keys)
        sjd = by.get(("sjd", w), {})
        both = [k for k in keys if k in sjd]
        rows.append({
            "method": m, "window": w, "samples": len(keys), "nfe": nfe, "nfe_accel": ar_nfe / nfe,
            "latency_accel": ar_lat / lat if lat > 0 else None, "e2e_accel": ar_e2e / e2e if e2e > 0 else None,
            "sjd_over": (sum(sjd[k]["nfe"] for k in both) / sum(recs[k]["nfe"] for k in both)) if both else None,
            "tokens_per_iter": sum(recs[k]["mean_committed"] for k in keys) / len(keys),
            "mean_window": sum(recs[k].get("mean_window", w if w != "auto" else 0.0) for k in keys) / len(keys),
            "entropy": sum(recs[k]["entropy"] for k in keys) / len(keys),
            "peak_mib": max(recs[k]["peak_bytes"] for k in keys) / 2**20,
            "ar_peak_mib": max(ar[k]["peak_bytes"] for k in keys) / 2**20,
        })
    return rows


def acceptance_curves(items: list[dict], kind: str, bins: int = 16) -> dict[str, list[float]]:
    """'method L' -> mean tokens committed by an iteration, per bin of the body position where the
    iteration starts (the prefill excluded). Binning by position, not by iteration index, keeps
    every sample in every bin (late iterations exist only for slow samples)."""
    out = {}
    by = _by(items, kind)
    for (m, w), recs in sorted(by.items(), key=lambda kv: (_ORDER.get(kv[0][0], 9), _wkey(kv[0][1]))):
        if m == "ar":
            continue
        sums, counts = [0.0] * bins, [0] * bins
        for r in recs.values():
            pos = r["committed"][0]
            for k in r["committed"][1:]:
                b = min(bins - 1, pos * bins // r["tokens"])
                sums[b] += k
                counts[b] += 1
                pos += k
        out[f"{m} L={w}"] = [s / c if c else float("nan") for s, c in zip(sums, counts)]
    return out


def quality_table(items: list[dict], kind: str) -> dict:
    """Frechet distance of each (method, window) to AR at the first seed, the same for AR at
    another seed (the noise floor), and prompt following where the prompts carry a target."""
    from spec_core.scd.quality import frechet_distance

    by = _by(items, kind)
    ar = by.get(("ar", 1), {})
    seeds = sorted({s for _, s in ar})
    if not seeds:
        return {}
    s0 = seeds[0]
    ref = {k: r for k, r in ar.items() if k[1] == s0}
    feats = lambda recs: torch.tensor([r["features"] for r in recs])  # noqa: E731
    out: dict = {"reference_seed": s0, "rows": []}
    if len(seeds) > 1 and len(ref) > 1:
        other = [r for k, r in ar.items() if k[1] == seeds[1]]
        out["ar_vs_ar"] = frechet_distance(feats(list(ref.values())), feats(other)) if len(other) > 1 else None
    for (m, w), recs in sorted(by.items(), key=lambda kv: (_wkey(kv[0][1]), _ORDER.get(kv[0][0], 9))):
        same = [r for k, r in recs.items() if k[1] == s0]
        if len(same) < 2:
            continue
        follows = [r["follows"] for r in same if r.get("follows") is not None]
        out["rows"].append({"method": m, "window": w,
                            "fd_to_ar": None if (m, w) == ("ar", 1) else frechet_distance(feats(list(ref.values())), feats(same)),
                            "following": sum(follows) / len(follows) if follows else None,
                            "following_n": len(follows)})
    return out


def nfe_plot_png(tables: dict[str, list[dict]], ar_nfe: dict[str, float]) -> bytes:
    """Mean NFE against window per method, one panel per kind (AR dashed; window auto a star at
    the mean L it chose)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if tables.get(k)]
    with PLOT_LOCK:
        fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            for m in sorted({r["method"] for r in tables[kind]} - {"ar"}):
                mine = [r for r in tables[kind] if r["method"] == m]
                pts = sorted((r["window"], r["nfe"]) for r in mine if r["window"] != "auto")
                line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
                for r in mine:
                    if r["window"] == "auto" and r["mean_window"] > 0:
                        ax.plot([r["mean_window"]], [r["nfe"]], marker="*", ms=11, ls="none",
                                c=line[0].get_color() if line else None, label=f"{m} auto")
            ax.axhline(ar_nfe[kind], ls="--", c="gray", label="ar")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("window L")
            ax.set_ylabel("NFE per sample")
            ax.set_title(kind)
            ax.legend()
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
    return buf.getvalue()


def curves_plot_png(curves: dict[str, dict[str, list[float]]]) -> bytes:
    """Tokens committed per iteration against the position in the body, per method and window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if curves.get(k)]
    with PLOT_LOCK:
        fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            for name, ys in curves[kind].items():
                ax.plot([(i + 0.5) / len(ys) for i in range(len(ys))], ys, label=name, lw=1.2,
                        ls="--" if name.startswith("sjd") else "-")
            ax.set_xlabel("position in the body where the iteration starts (fraction)")
            ax.set_ylabel("tokens committed per iteration")
            ax.set_title(kind)
            ax.legend(fontsize=6)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
    return buf.getvalue()


def grid_png(rows: list[tuple[str, list]], scale: int = 3) -> bytes:
    """A labelled grid: one row per method, one column per prompt (PIL images)."""
    from PIL import Image, ImageDraw

    cols = max(len(ims) for _, ims in rows)
    w, h = rows[0][1][0].size
    label_w = 110
    grid = Image.new("RGB", (label_w + cols * (w * scale + 4), len(rows) * (h * scale + 4)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (name, ims) in enumerate(rows):
        y = i * (h * scale + 4)
        draw.text((4, y + h * scale // 2 - 6), name, fill="black")
        for j, im in enumerate(ims):
            grid.paste(im.convert("RGB").resize((w * scale, h * scale), Image.NEAREST),
                       (label_w + j * (w * scale + 4), y))
    buf = io.BytesIO()
    grid.save(buf, format="PNG")
    return buf.getvalue()


def _following(r: dict) -> str:
    """Rate with its counts (the sampling noise of a rate from n samples is about 0.5 / sqrt(n))."""
    p, n = r["following"], r["following_n"]
    return "-" if p is None else f"{p:.2f} ({round(p * n)}/{n})"


def render(tables: dict, quality: dict, ar_stats: dict, plots: list[str], grids: list[str]) -> str:
    """report.md body."""
    lines = []
    for kind in KINDS:
        rows = tables.get(kind)
        if not rows:
            continue
        a = ar_stats[kind]
        lines += [f"## {kind.capitalize()}s: acceleration against AR",
                  f"{a['samples']} samples of {a['tokens']} tokens; AR: NFE {a['nfe']:.1f}, "
                  f"{a['latency_s']:.3f} s per sample, verified-distribution entropy {a['entropy']:.2f} nats/token.", "",
                  "| method | L | samples | NFE | NFE accel | latency accel | end-to-end accel | SJD NFE / NFE "
                  "| tokens / iter | peak state MiB (AR) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["method"] == "ar":
                continue
            lines.append(f"| {r['method']} | {_window_label(r)} | {r['samples']} | {r['nfe']:.1f} | {r['nfe_accel']:.2f}x | "
                         f"{fmt(r['latency_accel'])}x | {fmt(r['e2e_accel'])}x | {fmt(r['sjd_over'])} | "
                         f"{r['tokens_per_iter']:.2f} | "
                         f"{r['peak_mib']:.1f} ({r['ar_peak_mib']:.1f}) |")
        q = quality.get(kind) or {}
        if q.get("rows"):
            lines += ["", f"Quality against AR (seed {q['reference_seed']}): Frechet distance of 3x3-cell colour "
                      "features, beside AR at another seed (the sampling-noise floor); prompt following = the "
                      "dominant colour is the prompt's largest object's.", "",
                      f"AR vs AR at another seed: {fmt(q.get('ar_vs_ar'), '.4f')}", "",
                      "| method | L | FD to AR | prompt following |", "|---|---|---|---|"]
            lines += [f"| {r['method']} | {r['window']} | {fmt(r['fd_to_ar'], '.4f')} | {_following(r)} |"
                      for r in q["rows"]]
        lines.append("")
    lines += [f"![{p}]({p})" for p in plots] + [""] + [f"![{g}]({g})" for g in grids]
    return "\n".join(lines)
