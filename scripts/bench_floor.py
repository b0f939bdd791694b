"""Goodput's floor, measured: speculation that cannot pay (an untrained drafter, a training-free
proposer on prompts it does not fit) against AR, each run from the first request.

    python scripts/bench_floor.py                                   # a random small-size LLaVA
    python scripts/bench_floor.py --random tiny --batch 1 --batch 4  # the QUICK demo's size
    python scripts/bench_floor.py --target runs/reference/small/target --method fovea=untrained \
        --method eagle2=<trained drafter> --method recycling

Targets: `--target DIR` (repeatable), or `--random SIZE` (a reference LLaVA of that preset with
random weights, built in a temporary directory; the default: small). Methods: `name=untrained` (a
FOVEA drafter fresh from the target, never trained), `name=DIR` (a trained drafter), or a
training-free kind (pld, sam, lookahead, recycling); default: fovea=untrained and pld. Per target
and batch size, a new engine per run (the policy learns from nothing, as in a job's first shard)
decodes the same --prompts evaluation prompts of --max-new tokens: AR, and each method under the
goodput policy on the paper's tree shape (6x6x40; a proposer: its own budget) and the CPU tree
(3x4x8, at most 32 tokens per step). Runs are interleaved per repetition, every other one in
reverse order; printed: the min-time ratio to AR, the median of the paired ratios, and what the
policy chose (shares of AR steps, explorations and probes; learning's loss to AR as a share of
AR's time). Outputs are checked identical to AR's.

With --share-policy each method's engines hand one goodput policy on from run to run (as a
generate actor's engines do from shard to shard): the runs after the first, unrecorded one start
from what it learnt, and the choices printed add up over every run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from scripts.bench_batch import decode, open_target, prompts, requests, world_of_target  # noqa: E402
from spec_core.decoding import DecodeEngine, TreeConfig, load_drafter  # noqa: E402
from spec_core.decoding.proposers import DEFAULT_BUDGET, proposer_factory  # noqa: E402


def random_target(size: str, out: Path) -> str:
    """A reference LLaVA of preset `size` with random weights (its tokenizer trained on the
    reference corpus, as the worlds' are), saved to `out`."""
    from spec_core.reference.tasks import TASKS, all_words, corpus_texts, make_split
    from spec_core.reference.vlm.build import TOKENIZER_VOCAB
    from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
    from spec_core.reference.vlm.tokenizer import train_tokenizer

    samples = [s for t in TASKS for s in make_split(t, 4, 0, "train")]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(all_words())], TOKENIZER_VOCAB)
    build_vlm(PRESETS[size], tok, 0).save_pretrained(out)
    build_processor(PRESETS[size], tok).save_pretrained(out)
    return str(out)


def method_kwargs(spec: str, adapter, vocab: int) -> tuple[str, tuple[dict, int]]:
    """--method -> (name, (DecodeEngine keyword arguments, the paper tree's budget))."""
    from spec_core.fovea import FoveaDrafter

    name, _, source = spec.partition("=")
    if source == "untrained":
        torch.manual_seed(0)
        return name, ({"drafter": FoveaDrafter.from_target(adapter).eval()}, 40)
    if source:
        return name, ({"drafter": load_drafter(source, adapter).eval()}, 40)
    return name, ({"proposer": proposer_factory(name, vocab)}, DEFAULT_BUDGET[name])


def policy_line(pol) -> str:
    st = pol.stats()
    steps = max(st["steps"], 1)
    return (f"steps AR {st['ar_steps'] / steps:.0%}, explorations {st['explorations']}, probes {st['probes']}, "
            f"learning lost {st['learning_loss_s'] / max(st['ar_equivalent_s'], 1e-9):.1%} of AR's time")


def bench(path: str, label: str, args) -> None:
    adapter, processor = open_target(path, args.threads)
    reqs = requests(processor, prompts(args.prompts, world_of_target(path)), args.max_new)
    vocab = adapter.lm_head.weight.shape[0]
    methods = dict(method_kwargs(m, adapter, vocab) for m in args.method or ["fovea=untrained", "pld"])
    cap = max(r.inputs["input_ids"].shape[1] for r in reqs) + args.max_new + 128
    for b in args.batch or [1, 4, 16]:
        def make(drafter=None, proposer=None, tree=None, b=b, policy=None):
            return DecodeEngine(adapter, drafter, batch_size=b, capacity=cap, tree=tree, proposer=proposer,
                                compile=args.compile == "on", policy=policy)
        makers = {"ar": make}
        shared: dict[str, object] = {}  # --share-policy: a method's policy, handed from engine to engine
        for name, (kw, budget) in methods.items():
            for tname, tree in (("goodput 6x6", TreeConfig(6, 6, budget, policy="goodput")),
                                ("goodput cpu", TreeConfig(3, 4, 8, step_tokens=32, policy="goodput"))):
                def made(key=f"{name} {tname}", kw=kw, tree=tree, shared=shared):
                    engine = make(tree=tree, **kw, policy=shared.get(key))
                    if args.share_policy:
                        shared[key] = engine.policy
                    return engine
                makers[f"{name} {tname}"] = made
        times: dict[str, list[float]] = {k: [] for k in makers}
        last = {}
        for rep in range(args.reps + 1):  # the first repetition warms up (compiles, caches), unrecorded
            outs = {}
            for name, mk in (list(makers.items())[::-1] if rep % 2 else makers.items()):
                engine = mk()
                outs[name], dt, _ = decode(engine, adapter, reqs)
                last[name] = engine
                if rep:
                    times[name].append(dt)
            bad = [k for k, o in outs.items() if o != outs["ar"]]
            if bad:
                raise SystemExit(f"{label} batch {b}: {bad} differ from AR: not lossless")
        ar = times["ar"]
        print(f"{label} batch {b}: AR {1e3 * min(ar) / (len(reqs) * args.max_new):.3f} ms/token "
              f"(min of {args.reps}); outputs identical to AR")
        for name, t in times.items():
            if name != "ar":
                paired = statistics.median(a / x for a, x in zip(ar, t))
                print(f"  {name:24s} {min(ar) / min(t):.3f}x AR (median paired {paired:.3f}); "
                      + policy_line(last[name].policy))
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--random", choices=("tiny", "small"), default=None)
    ap.add_argument("--method", action="append", default=[])
    ap.add_argument("--batch", action="append", type=int, default=[])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", choices=("on", "off"), default="off")
    ap.add_argument("--share-policy", action="store_true",
                    help="one goodput policy per method across runs, as a generate actor keeps it across shards")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        targets = [(p, p) for p in args.target]
        if args.random or not targets:
            size = args.random or "small"
            targets.append((random_target(size, Path(tmp) / size), f"random {size}-size LLaVA"))
        for path, label in targets:
            bench(path, label, args)


if __name__ == "__main__":
    main()
