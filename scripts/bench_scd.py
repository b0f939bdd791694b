"""SJD and SCD against AR on the reference generator, in one process: NFE and latency ratios per
window and sampling temperature (SCD's gain over SJD grows with the sampling entropy).

    python scripts/bench_scd.py --generator runs/reference/small/generator --prompts 16 \
        --windows 16,32,64 --temperatures 1.0,0.7,0.4 [--video] [--batch 1]

For every temperature: AR (window 1), then SJD / SCD-MC / SCD-GS at every window, on the same
prompts and seeds, interleaved per batch. Prints mean entropy of the verified distributions,
mean NFE, NFE(AR)/NFE(method), NFE(SJD)/NFE(SCD) and the latency ratio (sampling loop, batch
`--batch`); a warm-up batch per configuration is excluded. --json writes every figure.
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


def run(lm: ReferenceGenerator, prompts: list[str], cfg: ScdConfig, batch: int, seed: int) -> dict:
    """All prompts in batches -> mean NFE, entropy, loop seconds, per-iteration commits."""
    layout = lm.layout()
    nfe, ent, loop_s, commits = [], [], 0.0, []
    for s in range(0, len(prompts), batch):
        chunk = prompts[s:s + batch]
        cond, uncond = lm.prompts(chunk, cfg.cfg)
        res = JacobiDecoder(lm, layout, cfg).run(cond, uncond, seed, list(range(s, s + len(chunk))))
        nfe += res.nfe_B.tolist()
        ent += res.entropy_B.tolist()
        loop_s += res.prefill_s + res.loop_s
        commits += res.committed
    return {"nfe": sum(nfe) / len(nfe), "entropy": sum(ent) / len(ent), "seconds": loop_s,
            "commits": commits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator", default="runs/reference/small/generator")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--windows", default="16,32,64")
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
    windows = [int(w) for w in a.windows.split(",")]
    out = {"generator": a.generator, "video": a.video, "prompts": len(prompts), "batch": a.batch,
           "tokens": lm.layout().length, "sampling": base.to_dict(), "rows": []}
    print(f"{'video' if a.video else 'image'}: {lm.layout().length} tokens per sample, "
          f"{len(prompts)} prompts, batch {a.batch}, top_k {base.top_k}, cfg {base.cfg_scale}")
    for temp in (float(t) for t in a.temperatures.split(",")):
        cfgs = [("ar", 1, ScdConfig(window=1, coupling="none", temperature=temp, top_k=base.top_k,
                                     top_p=base.top_p, cfg_scale=base.cfg_scale))]
        cfgs += [(m, w, ScdConfig(window=w, coupling=c, temperature=temp, top_k=base.top_k,
                                  top_p=base.top_p, cfg_scale=base.cfg_scale))
                 for w in windows for m, c in METHODS.items()]
        for _, _, cfg in cfgs:  # warm-up, not timed
            run(lm, prompts[:1], cfg, 1, a.seed + 99)
        res = {}
        for name, w, cfg in cfgs:
            res[(name, w)] = run(lm, prompts, cfg, a.batch, a.seed)
        ar = res[("ar", 1)]
        print(f"\nT={temp}: entropy {ar['entropy']:.2f} nats/token, AR NFE {ar['nfe']:.1f}, "
              f"AR {ar['seconds']:.2f}s")
        print(f"{'L':>4} {'method':>7} {'NFE':>7} {'AR/NFE':>7} {'SJD/SCD':>8} {'latency x':>9}")
        for w in windows:
            for m in METHODS:
                r = res[(m, w)]
                vs_sjd = res[("sjd", w)]["nfe"] / r["nfe"]
                print(f"{w:>4} {m:>7} {r['nfe']:7.1f} {ar['nfe'] / r['nfe']:7.2f} {vs_sjd:8.2f} "
                      f"{ar['seconds'] / r['seconds']:9.2f}")
                out["rows"].append({"temperature": temp, "method": m, "window": w, "nfe": r["nfe"],
                                    "nfe_accel": ar["nfe"] / r["nfe"], "sjd_over_method": vs_sjd,
                                    "latency_accel": ar["seconds"] / r["seconds"],
                                    "entropy": r["entropy"], "seconds": r["seconds"]})
        out["rows"].append({"temperature": temp, "method": "ar", "window": 1, "nfe": ar["nfe"],
                            "entropy": ar["entropy"], "seconds": ar["seconds"]})
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"\nbench_scd: {time.perf_counter() - t0:.0f}s")
