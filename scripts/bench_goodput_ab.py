"""A goodput policy setting, A/B: several policies with the default and several with the setting
changed, each against AR and a fixed tree (the CPU tree 3x4x8, at most 32 tokens per step) on
the same engine, target and prompts, in one process, interleaved per repetition (every other one
in reverse order). A policy's run-to-run spread is wide (which plan its first explorations settle
on), so each arm holds several policies, and the figure is the mean over them of the median
per-repetition throughput ratio to the fixed tree.

    python scripts/bench_goodput_ab.py --target runs/reference/small/target --batch 8 \
        --method runs/demo/train_drafter/reference-small-nc/drafter --set explore_share=0.02
    python scripts/bench_goodput_ab.py --batch 8 --method recycling --set alpha=0.1

`--set name=value` sets a `GoodputConfig` field of the B arm's policies after construction
(`alpha` also reaches the value curves). Prints per policy: throughput vs AR and vs the fixed tree, nodes per step, and
the share of draft + verify seconds its re-explorations took; then each arm's mean, min and max.
Outputs are checked identical to AR's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_batch import decode, open_target, prompts, requests, world_of_target  # noqa: E402
from spec_core.decoding import DecodeEngine, TreeConfig, load_drafter  # noqa: E402
from spec_core.decoding.proposers import DEFAULT_BUDGET, proposer_factory  # noqa: E402


def _setting(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    if not value:
        raise argparse.ArgumentTypeError(f"--set takes name=value, got {text!r}")
    return name, float(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="runs/reference/small/target")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--method", required=True, help="a drafter directory, or a training-free method (recycling, ...)")
    ap.add_argument("--set", type=_setting, action="append", required=True, help="name=value of the B arm")
    ap.add_argument("--policies", type=int, default=3, help="policies per arm")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    adapter, processor = open_target(args.target, args.threads)
    eos = adapter.model.generation_config.eos_token_id
    reqs = requests(processor, prompts(args.prompts, world_of_target(args.target)), args.max_new)
    cap = max(r.inputs["input_ids"].shape[1] for r in reqs) + args.max_new + 128
    vocab = adapter.lm_head.weight.shape[0]
    proposer = args.method in DEFAULT_BUDGET
    drafter = None if proposer else load_drafter(args.method, adapter).eval()
    budget = DEFAULT_BUDGET[args.method] if proposer else 40

    def engine(tree: TreeConfig | None, spec: bool = True) -> DecodeEngine:
        return DecodeEngine(adapter, drafter if spec else None, batch_size=args.batch, capacity=cap,
                            eos_token_ids=eos, proposer=proposer_factory(args.method, vocab) if spec and proposer else None,
                            tree=tree or TreeConfig())

    engines = {"ar": engine(None, spec=False), "fixed": engine(TreeConfig(3, 4, 8, step_tokens=32))}
    explored: dict[str, list[float]] = {}
    for i in range(args.policies):
        for arm in ("A", "B"):
            e = engine(TreeConfig(6, 6, budget, policy="goodput"))
            if arm == "B":
                for name, value in args.set:
                    if not hasattr(e.policy.cfg, name):
                        raise SystemExit(f"GoodputConfig has no setting {name!r}")
                    setattr(e.policy.cfg, name, type(getattr(e.policy.cfg, name))(value))
                    if name == "alpha":
                        for curves in e.policy.curves:
                            curves.alpha = value
            key, schedule, seconds = f"{arm}{i}", e.policy._schedule, explored.setdefault(f"{arm}{i}", [0.0, 0.0])

            def timed(was_explored, step_s, schedule=schedule, seconds=seconds):
                seconds[0 if was_explored else 1] += step_s
                return schedule(was_explored, step_s)

            e.policy._schedule = timed
            engines[key] = e
    for e in engines.values():  # warm-up (and every policy's first explorations)
        list(e.generate(reqs[: max(args.batch, 2)]))
    for seconds in explored.values():
        seconds[:] = [0.0, 0.0]
    times: dict[str, list[float]] = {k: [] for k in engines}
    for rep in range(args.reps):
        outs = {}
        for key, e in (list(engines.items())[::-1] if rep % 2 else engines.items()):
            outs[key], dt, _ = decode(e, adapter, reqs)
            times[key].append(dt)
        if any(out != outs["ar"] for out in outs.values()):
            raise SystemExit("an output differs from AR: not lossless")
    ar, fixed = times["ar"], times["fixed"]
    print(f"batch {args.batch}, {args.method}, B: {' '.join(f'{n}={v:g}' for n, v in args.set)}")
    print(f"  fixed 3x4x8/32: {statistics.median(a / x for a, x in zip(ar, fixed)):.3f}x AR")
    arms: dict[str, list[float]] = {"A": [], "B": []}
    for key in (k for k in engines if k not in ("ar", "fixed")):
        pol, t = engines[key].policy, times[key]
        to_fixed = statistics.median(f / x for f, x in zip(fixed, t))
        arms[key[0]].append(to_fixed)
        ex, ordinary = explored[key]
        print(f"  {key}: {statistics.median(a / x for a, x in zip(ar, t)):.3f}x AR, {to_fixed:.3f}x fixed, "
              f"{sum(pol.chosen) / max(len(pol.chosen), 1):.2f} nodes/step, re-explorations "
              f"{ex / max(ex + ordinary, 1e-12):.1%} of draft + verify seconds")
    for arm, ratios in arms.items():
        print(f"arm {arm} ({'default' if arm == 'A' else 'set'}): x fixed mean {sum(ratios) / len(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
