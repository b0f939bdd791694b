"""SJD and SCD against AR on the reference generator, in one process: NFE and latency ratios per
window and sampling temperature (SCD's gain over SJD grows with the sampling entropy), and window
auto (L chosen per iteration for tokens per second on this machine) beside the fixed windows.

    python scripts/bench_scd.py --generator runs/reference/small/generator --prompts 16 \
        --windows 16,32,64,auto --temperatures 1.0,0.7,0.4 [--video] [--batch 1] [--auto-max 64]

For every temperature: AR (window 1), then every method (SJD / SCD-MC / SCD-GS, or --methods) at
every window, on the same prompts and seeds, interleaved per batch (every configuration runs each
batch in turn, so drift of a shared machine hits all alike). Prints mean entropy of the verified
distributions, mean NFE, NFE(AR)/NFE(method), NFE(SJD)/NFE(SCD), the latency ratio (sampling loop,
batch `--batch`) and for auto the mean L it chose. A warm-up batch per configuration is excluded
(for auto it also starts the chooser's cost fit, which then carries over every batch, as in the
generate_images job). --json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from spec_core.reference.generator import load_generator  # noqa: E402
from spec_core.reference.generator.data import SceneSpec, heldout_prompts, video_example  # noqa: E402
from spec_core.scd import JacobiDecoder, ScdConfig  # noqa: E402
from spec_core.scd.adapters.reference import ReferenceGenerator  # noqa: E402

METHODS = {"sjd": "none", "scd_mc": "mc", "scd_gs": "gs"}


def prompts_for(n: int, video: bool, seed: int) -> list[str]:
    spec = SceneSpec()
    if video:
        import numpy as np

        rng = np.random.default_rng([seed, 4242])
        return [video_example(rng, spec)[0] for _ in range(n)]
    return [p for p, _, _ in heldout_prompts(seed, n, spec)]


class Tally:
    """One configuration: its decoder (kept across batches: window auto's chooser learns) and
    per-sample NFE, entropy, chosen window, and the summed loop seconds."""

    def __init__(self, lm: ReferenceGenerator, cfg: ScdConfig):
        self.lm, self.cfg = lm, cfg
        self.decoder = JacobiDecoder(lm, lm.layout(), cfg)
        self.nfe, self.ent, self.windows, self.seconds = [], [], [], 0.0

    def run(self, chunk: list[str], seed: int, keys: list[int], record: bool = True) -> None:
        cond, uncond = self.lm.prompts(chunk, self.cfg.cfg)
        res = self.decoder.run(cond, uncond, seed, keys)
        if record:
            self.nfe += res.nfe_B.tolist()
            self.ent += res.entropy_B.tolist()
            self.windows += [res.mean_window(b) for b in range(len(chunk))]
            self.seconds += res.prefill_s + res.loop_s

    def summary(self) -> dict:
        return {"nfe": sum(self.nfe) / len(self.nfe), "entropy": sum(self.ent) / len(self.ent),
                "seconds": self.seconds, "mean_window": sum(self.windows) / len(self.windows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator", default="runs/reference/small/generator")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--windows", default="16,32,64,auto", help="integers >= 2 and / or auto")
    ap.add_argument("--auto-max", type=int, default=None,
                    help="largest L of auto (default: the largest fixed window, else 32)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--temperatures", default="1.0,0.7,0.4")
    ap.add_argument("--video", action="store_true")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bundle = load_generator(a.generator)
    lm = ReferenceGenerator(bundle, video=a.video)
    base = bundle.default_sampling
    prompts = prompts_for(a.prompts, a.video, a.seed)
    windows = [w if w == "auto" else int(w) for w in a.windows.split(",")]
    methods = a.methods.split(",")
    fixed = [w for w in windows if w != "auto"]
    auto_max = a.auto_max or (max(fixed) if fixed else 32)
    out = {"generator": a.generator, "video": a.video, "prompts": len(prompts), "batch": a.batch,
           "tokens": lm.layout().length, "sampling": base.to_dict(), "auto_max": auto_max, "rows": []}
    print(f"{'video' if a.video else 'image'}: {lm.layout().length} tokens per sample, "
          f"{len(prompts)} prompts, batch {a.batch}, top_k {base.top_k}, cfg {base.cfg_scale}, auto up to L={auto_max}")
    for temp in (float(t) for t in a.temperatures.split(",")):
        def cfg(w, coupling, temp=temp):
            return ScdConfig(window=w, max_window=auto_max, coupling=coupling, temperature=temp,
                             top_k=base.top_k, top_p=base.top_p, cfg_scale=base.cfg_scale)

        tallies = {("ar", 1): Tally(lm, cfg(1, "none"))}
        tallies |= {(m, w): Tally(lm, cfg(w, METHODS[m])) for w in windows for m in methods}
        for t in tallies.values():  # warm-up, not timed
            t.run(prompts[:1], a.seed + 99, [0], record=False)
        for s in range(0, len(prompts), a.batch):  # interleaved: each batch through every configuration
            chunk = prompts[s:s + a.batch]
            for t in tallies.values():
                t.run(chunk, a.seed, list(range(s, s + len(chunk))))
        res = {k: t.summary() for k, t in tallies.items()}
        ar = res[("ar", 1)]
        print(f"\nT={temp}: entropy {ar['entropy']:.2f} nats/token, AR NFE {ar['nfe']:.1f}, "
              f"AR {ar['seconds']:.2f}s")
        print(f"{'L':>10} {'method':>7} {'NFE':>7} {'AR/NFE':>7} {'SJD/SCD':>8} {'latency x':>9}")
        for w in windows:
            for m in methods:
                r = res[(m, w)]
                vs_sjd = res[("sjd", w)]["nfe"] / r["nfe"] if ("sjd", w) in res else float("nan")
                label = f"auto~{r['mean_window']:.1f}" if w == "auto" else str(w)
                print(f"{label:>10} {m:>7} {r['nfe']:7.1f} {ar['nfe'] / r['nfe']:7.2f} {vs_sjd:8.2f} "
                      f"{ar['seconds'] / r['seconds']:9.2f}")
                out["rows"].append({"temperature": temp, "method": m, "window": w, "nfe": r["nfe"],
                                    "nfe_accel": ar["nfe"] / r["nfe"], "sjd_over_method": vs_sjd,
                                    "latency_accel": ar["seconds"] / r["seconds"], "mean_window": r["mean_window"],
                                    "entropy": r["entropy"], "seconds": r["seconds"]})
        for m in methods:
            if "auto" in windows:
                ch = tallies[(m, "auto")].decoder.chooser.stats()
                print(f"auto {m}: fit {ch['ms_intercept']:.2f} ms + {ch['ms_per_token']:.4f} ms/token, "
                      f"tokens per iteration by L {ch['commits_per_iteration']}")
        best = max((r for r in out["rows"] if r["temperature"] == temp and r["window"] != "auto"),
                   key=lambda r: r["latency_accel"], default=None)
        autos = [r for r in out["rows"] if r["temperature"] == temp and r["window"] == "auto"]
        if best and autos:
            top = max(autos, key=lambda r: r["latency_accel"])
            print(f"best fixed: {best['method']} L={best['window']} {best['latency_accel']:.2f}x; "
                  f"best auto: {top['method']} {top['latency_accel']:.2f}x")
        out["rows"].append({"temperature": temp, "method": "ar", "window": 1, "nfe": ar["nfe"],
                            "entropy": ar["entropy"], "seconds": ar["seconds"]})
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"\nbench_scd: {time.perf_counter() - t0:.0f}s")
