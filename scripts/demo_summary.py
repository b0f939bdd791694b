"""Print the demo's summary: what ran, what it shows (in words, with units), where the reports are.

    python scripts/demo_summary.py --out runs/demo --run-id reference-small --world runs/reference/small

The full demo (the `small` world) leads with FOVEA's batch-1 speedup over AR per task and the
lossless check. The QUICK demo (the `tiny` world: an untrained target about as cheap as its
drafter) leads with what it proves - every job ran, outputs are lossless - and labels its speed
figures as not meaningful.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.lib.storage import Storage, join  # noqa: E402

CHAIN = ("synth_data", "build_manifests", "precompute", "train_drafter", "generate", "generate_images")
TASK_NAMES = {"general_vqa": "general VQA", "text_vqa": "text VQA", "captioning": "captioning",
              "chart_vqa": "chart VQA", "reasoning": "reasoning", "multi_turn": "multi-turn"}
METHOD_NAMES = {"fovea": "FOVEA, the paper's tree (6 x 6, 40 nodes)",
                "fovea_cpu": "FOVEA, a CPU-sized tree (3 x 4, 8 nodes, at most 32 tokens per step)",
                "fovea_goodput": "FOVEA, the goodput policy (depth and nodes per step from measured costs)",
                "hf": "HF generate (no speculation; static cache and compiled decode when the job compiles)"}


def load_runs(store: Storage, out: str, run_id: str) -> dict[str, dict]:
    runs = {}
    for job in CHAIN:
        uri = join(out, job, run_id, "metrics.json")
        if store.exists(uri):
            runs[job] = json.loads(store.read_text(uri))
    return runs


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def decoding_lines(gen: dict, meaningful: bool) -> list[str]:
    """Each method against AR at batch 1, per task; against HF generate; the lossless check."""
    per, figs = gen["details"]["per_task"], gen["figures"]
    base = figs["baseline"]
    methods = [m for m in per.get("all", {}) if m != base]
    lines = []
    fastest = max((m for m in methods if m != "hf"), key=lambda m: per["all"][m].get("speedup") or 0, default=None)
    if meaningful and fastest:
        tasks = {t: per[t][fastest]["speedup"] for t in per if t != "all" and fastest in per[t]}
        slow = [TASK_NAMES.get(t, t) for t, v in tasks.items() if v is not None and v <= 1.0]
        ref = figs.get("fastest_baseline")
        vs = figs.get(f"{fastest}_speedup_batch1_vs_fastest") if ref not in (None, base) else None
        lines.append(f"  Headline: {METHOD_NAMES.get(fastest, fastest)} decodes {_x(per['all'][fastest]['speedup'])} "
                     f"as fast as AR at batch 1" + (f" ({_x(vs)} {METHOD_NAMES.get(ref, ref)}, the fastest baseline)"
                                                    if vs else "")
                     + (", faster on every task" if not slow else f"; not faster on {', '.join(slow)}"))
    for m in methods:
        overall = per["all"][m]
        tasks = [(TASK_NAMES.get(t, t), per[t][m]["speedup"]) for t in sorted(per) if t != "all" and m in per[t]]
        tau = f" (tokens per target step tau {overall['tau']:.2f})" if overall.get("tau") and m != "hf" else ""
        lines.append(f"  {METHOD_NAMES.get(m, m)}: {_x(overall['speedup'])} the speed of AR at batch 1{tau}")
        lines.append("      per task: " + ", ".join(f"{t} {_x(v)}" for t, v in tasks))
        ratios = figs.get(f"{m}_throughput_ratio") or {}
        if len(ratios) > 1:
            lines.append("      throughput against AR per batch size: "
                         + ", ".join(f"batch {b}: {_x(r)}" for b, r in ratios.items()))
    ref = figs.get("fastest_baseline")
    against = {m: figs.get(f"{m}_speedup_batch1_vs_fastest") for m in [base, *methods] if m != ref}
    if ref not in (None, base) and any(v is not None for v in against.values()):
        lines.append(f"  against the fastest baseline, {METHOD_NAMES.get(ref, ref)}, on the same samples (batch 1): "
                     + ", ".join(f"{m} {_x(v)}" for m, v in against.items()))
    turns = gen["counts"].get("turns", 0)
    bad = sum(figs.get(f"{m}_mismatches") or 0 for m in methods)
    lines.append(f"  outputs identical to AR, token for token: {'yes' if bad == 0 else 'NO'} "
                 f"({bad} differing outputs over {turns} turns x {len(methods)} methods, every batch size)")
    return lines


def image_lines(img: dict) -> list[str]:
    lines = []
    for key, nfe in img["figures"].items():
        if key.endswith("_nfe_accel") and nfe:
            kind, method = key[: -len("_nfe_accel")].split("_", 1)
            lat = img["figures"].get(f"{kind}_{method}_latency_accel", {})
            best = max(nfe, key=lambda w: lat.get(w) or 0)
            lines.append(f"  {kind} {method.upper().replace('_', '-')}: {nfe[best]:.2f}x fewer forward passes, "
                         f"{_x(lat.get(best))} lower latency than AR (window {best}; all windows: "
                         + ", ".join(f"L{w} {nfe[w]:.2f}/{_x(lat.get(w))}" for w in nfe) + ")")
    return lines


def render(store: Storage, out: str, run_id: str, world: str | None, quick: bool) -> str:
    runs = load_runs(store, out, run_id)
    w = json.loads(store.read_text(join(world, "metrics.json"))) if world and store.exists(join(world, "metrics.json")) else {}
    lines = ["", f"Demo summary: the reference world '{w.get('size', '?')}', run id '{run_id}', outputs under {out}", ""]
    chain = CHAIN[:-1] if str(w.get("size", "")).endswith("hires") else CHAIN  # no generator in a hires world
    ran = [j for j in chain if j in runs]
    lines.append(f"Every job ran: {'yes' if len(ran) == len(chain) else 'NO'} ({len(ran)} of {len(chain)}: "
                 + ", ".join(ran) + ")")
    gen, img, td = runs.get("generate"), runs.get("generate_images"), runs.get("train_drafter")
    if gen:
        if quick:
            lines += ["", "Speculative decoding (QUICK: the tiny world's target is untrained and about as cheap",
                      "per step as its drafter, so its speed figures say nothing about speculation; what this",
                      "run proves is that every output equals AR's; run the full demo for real speedups):"]
        else:
            lines += ["", "Speculative decoding, FOVEA against plain autoregressive decoding (AR) on the same samples:"]
        lines += decoding_lines(gen, meaningful=not quick)
    if td:
        f = td["figures"]
        top1 = ", ".join(f"{a:.2f}" for a in f.get("top1_per_depth") or [] if a is not None)
        lines += ["", f"Drafter training: {f['steps']} updates on {td['counts'].get('samples', '?')} samples, loss "
                  f"{f.get('first_loss', 0):.3f} at the first update -> {f.get('final_loss', 0):.3f} at the end; "
                  f"top-1 agreement with the target per draft step: {top1}"]
    if img:
        lines += ["", "Image / video generation, SJD and SCD against AR (lossless in distribution)"
                  + (" - QUICK: a tiny generator, figures not meaningful:" if quick else ":")]
        lines += image_lines(img)
    lines += ["", f"{'stage':<18}{'minutes':>8}  outputs"]
    if w:
        lines.append(f"{'reference world':<18}{w.get('build_seconds', 0) / 60:>8.1f}  {world} (report.md; built once, "
                     "then cached)")
    for job in ran:
        m = runs[job]
        lines.append(f"{job:<18}{m['wall_seconds'] / 60:>8.1f}  {m['run_dir']}/report.md")
    total = sum(runs[j]["wall_seconds"] for j in ran) / 60
    lines.append(f"{'jobs in all':<18}{total:>8.1f}  (the reference world's build not included)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--world", default=None, help="the reference world's directory (its metrics.json)")
    ap.add_argument("--quick", action="store_true", help="the tiny world: speed figures are labelled meaningless")
    args = ap.parse_args(argv)
    text = render(Storage(), args.out, args.run_id, args.world, args.quick)
    print(text)
    return text


if __name__ == "__main__":
    main()
