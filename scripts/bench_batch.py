"""Batch throughput, measured: the engine's AR against HF `generate` (eager and HF's own fast
path, static cache + compiled decode), eager and compiled; then speculation against AR at each
batch size under fixed trees and the goodput policy. Same target, prompts, process.

    python scripts/bench_batch.py --target runs/reference/small/target --batch 1 --batch 8 --reps 7
    python scripts/bench_batch.py --target runs/reference/small/target --grid \
        --method eagle2=<EAGLE-2-style drafter> --method fovea=<FOVEA drafter> --method recycling --reps 3

Part 1 (always):
Greedy, a fixed number of new tokens (EOS off on every side), the same dtype and torch threads.
HF decodes each batch as one left-padded `generate` call (spec_core.decoding.hf_engine; `hf_compiled`:
its static cache sized per call and the decoding forward compiled); the engine runs the same
prompts as a request stream on `batch` slots, eager and compiled (`DecodeEngine(compile=True)`).
Sides are interleaved per repetition, every other one in reverse order, after a warm-up repetition
that compiles (its seconds printed); the minimum of each is compared (a shared machine is
noisy), and each side's ratio to the fastest baseline (HF eager or compiled, whichever ran faster).
Also prints the eager engine's time per phase and its overhead: step time not spent inside the
target's forward. Outputs are checked token-identical.
Part 2 (--grid): evaluation prompts of the six tasks with real answers (EOS on; the hires mosaics for
a LLaVA-NeXT target, the small world's scenes otherwise); per batch size,
generated tokens/s of every method under the paper's tree (6x6x40), a CPU tree (3x4x8, at most
32 tokens per step) and the goodput policy on each of those two trees' shapes, against AR at that
batch size, every engine compiled (`--compile on`, the default), eager (`off`) or both (`both`:
ratios against the AR of the same mode), and HF's fast path as a baseline; all interleaved per
repetition, every other one in reverse order (medians of the ratios and min-time ratios printed),
with the mean
nodes per slot per step the policy chose, its share of AR steps, its calibration (nodes accepted
over nodes it predicted accepted) and its cost fit; then each goodput run against the method's best
fixed tree, paired per repetition (geometric mean, 95% interval). Outputs are checked identical to AR.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoConfig, AutoProcessor  # noqa: E402

from spec_core.decoding import DecodeEngine, Request, TreeConfig  # noqa: E402
from spec_core.decoding.hf_engine import HFEngine  # noqa: E402
from spec_core.reference import hires  # noqa: E402
from spec_core.reference import tasks as small  # noqa: E402
from spec_core.reference.tasks import TASKS  # noqa: E402
from spec_core.targets import load_target  # noqa: E402


def world_of_target(path: str):
    """The reference world whose prompts suit a target: the hires mosaics for a LLaVA-NeXT (AnyRes)
    target, the small world's scenes otherwise."""
    return hires if AutoConfig.from_pretrained(path).model_type == "llava_next" else small


def prompts(n: int, world=small) -> list[tuple[str, Image.Image]]:
    """n evaluation prompts of a reference world (`world_of_target`), the six tasks in turn."""
    per = [world.make_split(t, -(-n // len(TASKS)), 0, "eval") for t in TASKS]
    samples = [s for group in zip(*per) for s in group][:n]
    return [(s["conversation"][:1], Image.open(io.BytesIO(s["image_png"])).convert("RGB")) for s in samples]


class ForwardTimer:
    """Seconds spent inside the target's language-model forwards (hooks on the decoder)."""

    def __init__(self, module: torch.nn.Module):
        self.seconds, self._t0 = 0.0, 0.0
        self._h = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]

    def _start(self, *_):
        self._t0 = time.perf_counter()

    def _stop(self, *_):
        self.seconds += time.perf_counter() - self._t0

    def close(self):
        for h in self._h:
            h.remove()


def open_target(path: str, threads: int):
    """(adapter, processor) of the target at `path`, torch set to `threads` threads: every bench's start."""
    torch.set_num_threads(threads)
    return load_target(path), AutoProcessor.from_pretrained(path)


def requests(processor, batch, max_new: int) -> list[Request]:
    out = []
    for i, (conv, im) in enumerate(batch):
        text = processor.tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        out.append(Request(dict(processor(text=text, images=im, add_special_tokens=False, return_tensors="pt")),
                           max_new, key=i))
    return out


def decode(engine, adapter, reqs: list[Request], time_forwards: bool = False) -> tuple[list[list[int]], float, dict]:
    """Outputs in request order, wall seconds, and the engine's phases; with `time_forwards` (an
    eager side: hooks would break a compiled graph) also the seconds spent inside the target's
    language-model forwards."""
    timer = ForwardTimer(adapter.model.model.language_model) if time_forwards else None
    t0 = time.perf_counter()
    results = sorted(engine.generate(reqs), key=lambda r: r.key)
    dt = time.perf_counter() - t0
    if timer is not None:
        timer.close()
    return [r.sequences[0].tolist() for r in results], dt, {**engine.phase_s, "forward": timer.seconds if timer else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="runs/reference/small/target")
    ap.add_argument("--batch", action="append", type=int, default=[])
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--grid", action="store_true", help="part 2: speculation vs AR per batch size and tree policy")
    ap.add_argument("--method", action="append", default=[],
                    help="name=drafter_dir (a trained drafter) or a training-free kind (pld, sam, lookahead, recycling)")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--grid-max-new", type=int, default=96)
    ap.add_argument("--grid-batch", action="append", type=int, default=[],
                    help="grid batch sizes (default 1, 2, 4, 8, 16); --batch sets part 1's")
    ap.add_argument("--eager-drafter", action="store_true",
                    help="grid: also goodput with the drafter fed at every AR step (no deferral), to compare")
    ap.add_argument("--compile", choices=("on", "off", "both"), default="on",
                    help="grid: engines compiled, eager, or both (each against the AR of its mode)")
    args = ap.parse_args()
    adapter, processor = open_target(args.target, args.threads)
    world = world_of_target(args.target)
    for b in args.batch or [1, 8]:
        reqs = requests(processor, prompts(b, world), args.max_new)
        cap = 512 + args.max_new
        sides = {"hf": lambda b=b: HFEngine(adapter, batch_size=b),  # EOS off on every side
                 "hf_compiled": lambda b=b: HFEngine(adapter, batch_size=b, compile=True),
                 "engine": lambda b=b, cap=cap: DecodeEngine(adapter, None, batch_size=b, capacity=cap),
                 "engine_compiled": lambda b=b, cap=cap: DecodeEngine(adapter, None, batch_size=b, capacity=cap,
                                                                      compile=True)}
        seconds: dict[str, list[float]] = {k: [] for k in sides}
        outs, phases, warm = {}, [], {}
        for rep in range(args.reps + 1):  # the first repetition is a warm-up; then every other one reversed
            for name, make in (list(sides.items())[::-1] if rep % 2 else sides.items()):
                engine = make()
                outs[name], dt, ph = decode(engine, adapter, reqs, time_forwards=name == "engine")
                if not rep:
                    warm[name] = dt
                else:
                    seconds[name].append(dt)
                    if name == "engine":
                        phases.append((dt, ph))
        tokens = b * args.max_new
        best = {k: min(v) for k, v in seconds.items()}
        base = min(("hf", "hf_compiled"), key=best.get)
        print(f"batch {b} (min of {args.reps}; warm-up seconds, compiles included: "
              + ", ".join(f"{k} {v:.1f}" for k, v in warm.items()) + ")")
        for k, v in best.items():
            paired = statistics.median(x / y for x, y in zip(seconds[k], seconds[base]))
            print(f"  {k:16s} {1e3 * v / tokens:.3f} ms/token, {v / best[base]:.3f}x the time of {base} "
                  f"(median of the paired ratios {paired:.3f})")
        print(f"  engine_compiled / engine time {best['engine_compiled'] / best['engine']:.3f}; "
              f"outputs identical: {all(o == outs['hf'] for o in outs.values())}")
        dt, ph = min(phases, key=lambda x: x[0])
        print("  eager engine phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items())
              + f"; overhead (step time outside target forwards) {1 - ph['forward'] / dt:.1%}")

    if args.grid:
        grid(adapter, processor, args)


TREES = {"paper 6x6x40": TreeConfig(6, 6, 40), "cpu 3x4x8/32": TreeConfig(3, 4, 8, step_tokens=32),
         "goodput (40)": TreeConfig(6, 6, 40, policy="goodput"),
         "goodput cpu 3x4x8": TreeConfig(3, 4, 8, step_tokens=32, policy="goodput")}


def grid(adapter, processor, args) -> None:
    """Speculation against AR per batch size (see the module docstring)."""
    from spec_core.decoding import load_drafter
    from spec_core.decoding.proposers import DEFAULT_BUDGET, proposer_factory

    eos = adapter.model.generation_config.eos_token_id
    reqs = requests(processor, prompts(args.prompts, world_of_target(args.target)), args.grid_max_new)
    vocab = adapter.lm_head.weight.shape[0]
    methods = {}
    for spec in args.method:
        name, _, path = spec.partition("=")
        if path:
            methods[name] = dict(drafter=load_drafter(path, adapter).eval())
        else:  # training-free: its own budget for the fixed trees
            methods[name] = dict(proposer=proposer_factory(name, vocab), budget=DEFAULT_BUDGET[name])
    cap = max(r.inputs["input_ids"].shape[1] for r in reqs) + args.grid_max_new + 128
    modes = {"on": ("compiled",), "off": ("eager",), "both": ("eager", "compiled")}[args.compile]
    for b in args.grid_batch or [1, 2, 4, 8, 16]:
        engines: dict[tuple, object] = {("hf", "hf_compiled", ""): HFEngine(adapter, batch_size=b, eos_token_ids=eos,
                                                                          compile=True)}
        for mode in modes:
            def make(drafter=None, tree=None, proposer=None, mode=mode, b=b, **kw):
                return DecodeEngine(adapter, drafter, batch_size=b, capacity=cap, tree=tree, eos_token_ids=eos,
                                    proposer=proposer, compile=mode == "compiled", **kw)
            engines[(mode, "ar", "")] = make()
            for name, m in methods.items():
                for tname, tree in TREES.items():
                    if "budget" in m and tname != "cpu 3x4x8/32":  # a proposer's own draft size
                        tree = TreeConfig(tree.width, tree.depth, m["budget"], tree.step_tokens, tree.policy)
                    label = tname.replace("40", str(m["budget"])) if "budget" in m else tname  # the budget run
                    engines[(mode, name, label)] = make(m.get("drafter"), tree, m.get("proposer"))
                    if args.eager_drafter and "drafter" in m and tname == "goodput (40)":  # the deferral's worth
                        engines[(mode, name, "goodput eager")] = make(m["drafter"], tree, defer_drafter=False)
        warm = {}
        for key, e in engines.items():  # warm-up: compiles, and the goodput policy's first calibration
            t0 = time.perf_counter()
            list(e.generate(reqs[: max(b, 2)]))
            warm[key] = time.perf_counter() - t0
        times: dict[tuple, list[float]] = {k: [] for k in engines}
        for rep in range(args.reps):  # every other repetition in reverse order: no side always runs first
            outs = {}
            for key, e in (list(engines.items())[::-1] if rep % 2 else engines.items()):
                outs[key], dt, _ = decode(e, adapter, reqs)
                times[key].append(dt)
            ref = outs[(modes[0], "ar", "")]
            for key, out in outs.items():
                if out != ref:
                    raise SystemExit(f"batch {b}: {key} differs from AR: not lossless")
        fastest = min((k for k in times if k[1] in ("ar", "hf_compiled")), key=lambda k: min(times[k]))
        print(f"\nbatch {b}: HF compiled {sum(len(r) for r in ref) / min(times[('hf', 'hf_compiled', '')]):.1f} "
              f"tokens/s; the fastest baseline: {' '.join(fastest[:2])}; warm-up seconds "
              + ", ".join(f"{'/'.join(k[:2])} {v:.1f}" for k, v in warm.items() if k[1] in ("ar", "hf_compiled")))
        for mode in modes:
            ar = times[(mode, "ar", "")]
            print(f"  {mode}: AR {sum(len(r) for r in ref) / min(ar):.1f} tokens/s, "
                  f"{min(times[fastest]) / min(ar):.2f}x the fastest baseline's throughput")
            for key, t in times.items():
                if key[0] != mode or key[1] == "ar":
                    continue
                print(f"  {key[1]:10s} {key[2]:14s} " + _against(ar, t, times[fastest], engines[key].policy))
            paired_to_best_fixed({k[1:]: v for k, v in times.items() if k[0] == mode},
                                 {k[1:]: v for k, v in engines.items() if k[0] == mode})


def _against(ar: list[float], t: list[float], fastest: list[float], pol) -> str:
    """A run's throughput against AR (per repetition, interleaved: the median; and min-time) and
    against the fastest baseline, with the goodput policy's choices."""
    ratios = [a / x for a, x in zip(ar, t)]
    nodes = (f", {sum(pol.chosen) / max(len(pol.chosen), 1):.1f} nodes/step" if pol is not None else "") + (
        f", width {sum(pol.widths) / len(pol.widths):.1f}" if pol is not None and pol.widths else "")
    if pol is not None:  # why it chose so: AR share, acceptance calibration, the cost fit
        st = pol.stats()
        nodes += (f"\n{'':27s}AR steps {pol.depths.count(0) / max(len(pol.depths), 1):.0%}, accepted / "
                  f"predicted {st['observed_accepted'] / max(st['predicted_accepted'], 1e-9):.2f}, verify "
                  f"{st['verify_ms_intercept']:.2f} + {st['verify_ms_per_token']:.3f} ms/token, draft "
                  f"{st['draft_ms_per_depth']:.2f} ms/depth, commit extra {st['commit_extra_ms']:.2f} ms, "
                  f"every step {st['step_overhead_ms']:.2f} ms")
    return (f"throughput vs AR: median {statistics.median(ratios):.2f}x (min-time {min(ar) / min(t):.2f}x), "
            f"vs the fastest baseline {min(fastest) / min(t):.2f}x{nodes}")


def paired_to_best_fixed(times: dict[tuple, list[float]], engines: dict) -> None:
    """Per method, each goodput run against its best fixed tree (the one of highest median
    throughput ratio to AR, as the table above prints): the geometric mean of the per-repetition
    throughput ratios with a 95% interval (Student's t on the log ratios). The repetitions are
    paired - each ran the two side by side - so the interval holds the machine's drift out; the
    best fixed tree is picked after the fact, so a tie reads slightly below 1."""
    from spec_core.scd.window import t95

    ar = times[("ar", "")]
    for name in dict.fromkeys(k[0] for k in times if k[0] != "ar"):
        fixed = [k for k in times if k[0] == name and engines[k].policy is None]
        if not fixed:
            continue
        best = max(fixed, key=lambda k: statistics.median(a / x for a, x in zip(ar, times[k])))  # as printed
        for k in (k for k in times if k[0] == name and engines[k].policy is not None):
            logs = [math.log(f / g) for f, g in zip(times[best], times[k])]  # > 0: goodput faster
            m = sum(logs) / len(logs)
            half = (t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))) if len(logs) > 1 else math.inf
            print(f"  {name:10s} {k[1]:14s} / {best[1]}: {math.exp(m):.3f} "
                  f"[{math.exp(m - half):.3f}, {math.exp(m + half):.3f}] (paired, 95%)")


if __name__ == "__main__":
    main()
