"""The generate job's summary: per-task tau / MAT / batch-1 latency speedup against the baseline
method on the same samples, throughput per batch size, memory, lossless checks, a latency CDF.

Inputs are the committed shards' tables (jobs._generate.worker: metrics, responses) and
markers (throughput, memory). Speedup at batch 1 is a ratio of summed latencies (prefill + decode)
over the (sample, turn) pairs both methods completed; throughput is generated tokens per second
of actor time, summed over shards, so it is per actor.
"""

from __future__ import annotations

import io
from collections import defaultdict

from jobs.lib.metrics import PLOT_LOCK, fmt
from spec_core.decoding.goodput import GoodputPolicy

ALL = "all"


def _key(r: dict) -> tuple[str, int]:
    return r["id"], r["turn"]


def task_table(metrics: list[dict], methods: list[str], baseline: str) -> dict[str, dict[str, dict]]:
    """task (and 'all') -> method -> {turns, new_tokens, steps, tau, mat, latency_s, speedup}."""
    by_method = {m: {_key(r): r for r in metrics if r["method"] == m} for m in methods}
    base = by_method[baseline]
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    tasks = sorted({r["task"] for r in metrics}) + [ALL]
    for m in methods:
        common = [k for k in by_method[m] if k in base]
        for task in tasks:
            keys = [k for k in common if task == ALL or by_method[m][k]["task"] == task]
            if not keys:
                continue
            rows = [by_method[m][k] for k in keys]
            steps = sum(r["steps"] for r in rows)
            committed = sum(r["new_tokens"] - 1 for r in rows if r["steps"])  # the first token is the prefill's
            lat = sum(r["latency_s"] for r in rows)
            base_lat = sum(base[k]["latency_s"] for k in keys)
            tau = committed / steps if steps else None
            out[task][m] = {"turns": len(rows), "new_tokens": sum(r["new_tokens"] for r in rows), "steps": steps,
                            "tau": tau, "mat": None if tau is None else tau - 1, "latency_s": lat,
                            "speedup": base_lat / lat if lat > 0 else None}
    return dict(out)


def throughput_table(records: list[dict], methods: list[str], baseline: str) -> dict[str, dict[str, dict]]:
    """method -> batch size -> {tokens, seconds, tokens_per_s, ratio (to the baseline), mismatches}."""
    sums: dict[str, dict[str, list]] = {m: defaultdict(lambda: [0, 0.0, 0]) for m in methods}
    phases: dict[str, dict[str, dict[str, float]]] = {m: defaultdict(lambda: defaultdict(float)) for m in methods}
    policy: dict[str, dict[str, dict]] = {m: defaultdict(dict) for m in methods}
    for rec in records:
        for m in methods:
            for batch, t in rec.get("throughput", {}).get(m, {}).items():
                s = sums[m][batch]
                s[0], s[1], s[2] = s[0] + t["tokens"], s[1] + t["seconds"], s[2] + t.get("mismatches", 0)
                for phase, sec in t.get("phases", {}).items():
                    phases[m][batch][phase] += sec
                for k, v in t.get("policy", {}).items():  # counts add up; the cost fit: the latest shard's
                    p = policy[m][batch]
                    p[k] = p.get(k, 0) + v if k in GoodputPolicy.ADDITIVE else v
    out = {}
    for m in methods:
        out[m] = {}
        for batch in sorted(sums[m], key=int):
            tok, sec, bad = sums[m][batch]
            b_tok, b_sec, _ = sums[baseline].get(batch, (0, 0.0, 0))
            tps = tok / sec if sec > 0 else None
            base_tps = b_tok / b_sec if b_sec > 0 else None
            out[m][batch] = {"tokens": tok, "seconds": round(sec, 3), "tokens_per_s": tps,
                             "ratio": tps / base_tps if tps and base_tps else None, "mismatches": bad,
                             "phases": {p: round(v, 3) for p, v in phases[m][batch].items()}}
            if policy[m].get(batch):
                out[m][batch]["policy"] = policy[m][batch]
    return out


def _choices(p: dict) -> str:
    """A goodput run's steps by kind and what its learning lost to AR (cells of the policy table)."""
    steps = max(p["steps"], 1)
    kinds = " / ".join(f"{p.get(k, 0) / steps:.0%}" for k in ("ar_steps", "explorations", "probes"))
    share = p.get("learning_loss_s", 0.0) / p["ar_equivalent_s"] if p.get("ar_equivalent_s") else None
    return f"{kinds} | {p.get('learning_loss_s', 0.0):.2f} ({fmt(share, '.1%')})"


def overtaken_at(throughput: dict[str, dict], method: str) -> int | None:
    """The smallest batch size at which the baseline's throughput beats the method's."""
    for batch, t in sorted(throughput[method].items(), key=lambda kv: int(kv[0])):
        if t["ratio"] is not None and t["ratio"] < 1:
            return int(batch)
    return None


def mismatches(responses: list[dict], methods: list[str], baseline: str) -> dict[str, int]:
    """(sample, turn) pairs whose tokens differ from the baseline's (greedy: must be 0)."""
    base = {_key(r): r["response_ids"] for r in responses if r["method"] == baseline}
    return {m: sum(1 for r in responses if r["method"] == m and _key(r) in base
                   and list(r["response_ids"]) != list(base[_key(r)])) for m in methods if m != baseline}


def memory_table(records: list[dict], methods: list[str], baseline: str) -> dict[str, dict]:
    """method -> peak decoding state (caches, visual memory, drafter weights) and, on GPUs, peak
    allocated memory, in MiB, with the difference to the baseline."""
    out = {}
    for kind in ("state_bytes", "gpu_peak_bytes"):
        peak = {m: max((r.get(kind, {}).get(m, 0) for r in records), default=0) for m in methods}
        if not any(peak.values()):
            continue
        for m in methods:
            out.setdefault(m, {})[kind.replace("_bytes", "_mib")] = round(peak[m] / 2**20, 2)
            out[m][kind.replace("_bytes", "_delta_mib")] = round((peak[m] - peak[baseline]) / 2**20, 2)
    return out


def latency_cdf_png(metrics: list[dict], methods: list[str]) -> bytes:
    """Per-sample latency (all turns) CDF per method, as PNG bytes."""
    with PLOT_LOCK:
        return _latency_cdf_png(metrics, methods)


def _latency_cdf_png(metrics: list[dict], methods: list[str]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for m in methods:
        per = defaultdict(float)
        for r in metrics:
            if r["method"] == m:
                per[r["id"]] += r["latency_s"]
        xs = sorted(per.values())
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{m} (n={len(xs)})")
    ax.set_xlabel("latency per sample, s (batch 1, all turns)")
    ax.set_ylabel("fraction of samples")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def render(tasks: dict, throughput: dict, memory: dict, bad: dict, methods: list[str], baseline: str,
           cdf_name: str | None) -> str:
    """Markdown sections for report.md."""
    others = [m for m in methods if m != baseline]
    head = "| task | turns | " + " | ".join(f"{m} tau | {m} MAT | {m} speedup" for m in others) + " |"
    lines = ["## Per task (batch 1, against " + f"`{baseline}` on the same samples)", "", head,
             "|" + "---|" * (2 + 3 * len(others))]
    for task, row in tasks.items():
        turns = row.get(baseline, {}).get("turns", "")
        cells = [f"{fmt(row.get(m, {}).get('tau'))} | {fmt(row.get(m, {}).get('mat'))} | "
                 f"{fmt(row.get(m, {}).get('speedup'))}x" for m in others]
        name = f"**{task}**" if task == ALL else task
        lines.append(f"| {name} | {turns} | " + " | ".join(cells) + " |")
    batches = sorted({b for m in methods for b in throughput.get(m, {})}, key=int)
    lines += ["", "## Throughput (generated tokens/s per actor; ratio to " + f"`{baseline}`)", "",
              "| batch | " + " | ".join(methods) + " |", "|" + "---|" * (1 + len(methods))]
    for b in batches:
        cells = []
        for m in methods:
            t = throughput.get(m, {}).get(b)
            cells.append("-" if t is None else fmt(t["tokens_per_s"], ".1f") +
                         ("" if m == baseline else f" ({fmt(t['ratio'])}x)"))
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    for m in others:
        at = overtaken_at(throughput, m)
        lines.append("")
        lines.append(f"- `{m}`: " + (f"`{baseline}` overtakes at batch {at}" if at else
                                      f"ahead of `{baseline}` at every measured batch size"))
    profile = [(m, b, t["phases"]) for m in methods for b, t in sorted(throughput.get(m, {}).items(),
                                                                      key=lambda kv: int(kv[0])) if t.get("phases")]
    if profile:
        lines += ["", "## Where the time goes (ms per generated token: prefill, draft, verify, commit "
                  "with the drafter's catch-up)", "", "| method | batch | prefill | draft | verify | commit |",
                  "|---|---|---|---|---|---|"]
        for m, b, ph in profile:
            tok = max(throughput[m][b]["tokens"], 1)
            lines.append(f"| {m} | {b} | " + " | ".join(f"{1e3 * ph.get(p, 0.0) / tok:.2f}" for p in
                                                       ("prefill", "draft", "verify", "commit")) + " |")
    chosen = [(m, b, t["policy"]) for m in methods for b, t in sorted(throughput.get(m, {}).items(),
                                                                     key=lambda kv: int(kv[0])) if t.get("policy")]
    if chosen:
        lines += ["", "## Goodput policy (nodes verified per slot per step, the cost fit of a verification "
                  "forward, acceptance predicted vs observed)", "",
                  "| method | batch | steps | nodes per slot per step | draft depth per step | verify ms = a + b x tokens "
                  "| draft ms per depth | commit ms beyond AR's | ms every step pays | accepted drafts predicted / observed "
                  "| steps AR / explorations / probes | learning lost to AR (s; share of AR's time) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m, b, p in chosen:
            calib = p["predicted_accepted"] / p["observed_accepted"] if p.get("observed_accepted") else None
            lines.append(f"| {m} | {b} | {p['steps']} | {p['nodes'] / max(p['steps'], 1):.2f} | "
                         f"{p.get('depth', 0) / max(p['steps'], 1):.2f} | "
                         f"{p['verify_ms_intercept']:.2f} + {p['verify_ms_per_token']:.3f} x T | "
                         f"{p['draft_ms_per_depth']:.2f} | "
                         f"{p.get('commit_extra_ms', 0.0):.2f} | "
                         f"{p.get('step_overhead_ms', 0.0):.2f} | {fmt(calib)} | {_choices(p)} |")
    if memory:
        lines += ["", "## Memory (peak, MiB; delta to " + f"`{baseline}`)", "",
                  "| method | " + " | ".join(memory[methods[0]]) + " |", "|" + "---|" * (1 + len(memory[methods[0]]))]
        lines += [f"| {m} | " + " | ".join(str(v) for v in memory[m].values()) + " |" for m in methods]
    if bad:
        lines += ["", "## Lossless check (greedy: outputs must equal the baseline's)", ""]
        lines += [f"- `{m}`: {n} (sample, turn) pairs differ from `{baseline}`" for m, n in bad.items()]
    if cdf_name:
        lines += ["", f"![latency CDF]({cdf_name})"]
    return "\n".join(lines) + "\n"


def fastest(tasks: dict, baselines: list[str]) -> str | None:
    """The baseline (AR, HF generate; eager or compiled) of least batch-1 latency on the samples."""
    overall = tasks.get(ALL, {})
    timed = [m for m in baselines if overall.get(m, {}).get("latency_s")]
    return min(timed, key=lambda m: overall[m]["latency_s"]) if timed else None


def compile_table(records: list[dict], methods: list[str]) -> dict[str, dict[str, dict]]:
    """method -> batch size -> what compiling cost an actor (graphs built, recompiles, shapes,
    first-call seconds; the largest over the actors' latest shards: their steps compile once)."""
    out: dict[str, dict[str, dict]] = {}
    for rec in records:
        for m, by_batch in rec.get("compile", {}).items():
            if m not in methods:
                continue
            for b, st in by_batch.items():
                old = out.setdefault(m, {}).get(b, {})
                out[m][b] = {k: max(v, old.get(k, 0)) for k, v in st.items()}
    return out


def render_compile(compiled: dict[str, dict[str, dict]]) -> str:
    """The compiled steps' cost per method and batch size (none where nothing compiled)."""
    rows = [(m, b, st) for m, by in compiled.items() for b, st in sorted(by.items(), key=lambda kv: int(kv[0]))
            if st.get("shapes")]
    if not rows:
        return ""
    lines = ["", "## Compiled steps (per actor: graphs built, recompiles after a shape's first call, shapes, "
             "first-call seconds)", "", "| method | batch | graphs | recompiles | shapes | warm-up s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {m} | {b} | {st['graphs']} | {st['recompiles']} | {st['shapes']} | {st['warmup_s']:.1f} |"
              for m, b, st in rows]
    return "\n".join(lines) + "\n"


def render_against(tasks: dict, throughput: dict, methods: list[str], reference: str) -> str:
    """A second view of the same run: every method's batch-1 speedup and throughput ratio against
    `reference`, the fastest baseline (HF `generate`: at batch > 1 its static, padded batches)."""
    others = [m for m in methods if m != reference]
    lines = ["", f"## Against `{reference}` (the fastest baseline on the same samples)", "",
             "| task | " + " | ".join(f"{m} speedup" for m in others) + " |", "|" + "---|" * (1 + len(others))]
    for task, row in tasks.items():
        name = f"**{task}**" if task == ALL else task
        lines.append(f"| {name} | " + " | ".join(f"{fmt(row.get(m, {}).get('speedup'))}x" for m in others) + " |")
    batches = sorted({b for m in methods for b in throughput.get(m, {})}, key=int)
    lines += ["", "| batch | " + " | ".join(f"{m} throughput ratio" for m in others) + " |",
              "|" + "---|" * (1 + len(others))]
    for b in batches:
        lines.append(f"| {b} | " + " | ".join(f"{fmt(throughput.get(m, {}).get(b, {}).get('ratio'))}x" for m in others)
                     + " |")
    return "\n".join(lines) + "\n"
