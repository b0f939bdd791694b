"""Speculative decoding vs AR on the same engine, same samples, same process (CPU or GPU).

    python scripts/bench_decoding.py --target runs/reference/small/target \
        --drafter fovea=runs/x/drafter --drafter eagle=runs/y/drafter --per-task 10 \
        --tree 6x6x40 --tree 4x5x12 --batch 1 --batch 4

For every (drafter, tree): per task tau (tokens committed per verification, bonus included), MAT
(accepted drafts per verification) and the batch-1 latency speedup over AR; then generated tokens/s
at each batch size against AR at that batch size. Outputs are checked token-identical to AR (greedy).
Warm-up (one sample per method) is excluded.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoProcessor  # noqa: E402

from spec_core.decoding import DecodeEngine, Request, TreeConfig  # noqa: E402
from spec_core.fovea import FoveaDrafter  # noqa: E402
from spec_core.reference.tasks import TASKS, make_split  # noqa: E402
from spec_core.targets import load_target  # noqa: E402


def prompt(processor, sample: dict) -> dict:
    image = Image.open(io.BytesIO(sample["image_png"])).convert("RGB")
    text = processor.tokenizer.apply_chat_template(sample["conversation"][:1], tokenize=False,
                                                    add_generation_prompt=True)
    return dict(processor(text=text, images=image, add_special_tokens=False, return_tensors="pt"))


def run(adapter, drafter, tree, requests, batch, eos, capacity) -> tuple[list, float]:
    engine = DecodeEngine(adapter, drafter, batch_size=batch, capacity=capacity, tree=tree, eos_token_ids=eos)
    list(engine.generate(requests[:1]))  # warm-up
    t0 = time.perf_counter()
    results = list(engine.generate(requests))
    return results, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="runs/reference/small/target")
    ap.add_argument("--drafter", action="append", default=[], help="name=directory (repeatable)")
    ap.add_argument("--per-task", type=int, default=10)
    ap.add_argument("--max-new", type=int, default=200)
    ap.add_argument("--tree", action="append", default=[], help="WIDTHxDEPTHxBUDGET (repeatable); default 6x6x40")
    ap.add_argument("--batch", action="append", type=int, default=[], help="batch sizes for throughput (default 1)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    adapter = load_target(args.target)
    processor = AutoProcessor.from_pretrained(args.target)
    eos = adapter.model.generation_config.eos_token_id
    samples = [s for t in TASKS for s in make_split(t, args.per_task, 0, "eval")]
    requests = [Request(prompt(processor, s), args.max_new, (s["task"], s["id"])) for s in samples]
    capacity = max(r.inputs["input_ids"].shape[1] for r in requests) + args.max_new + 64
    trees = [TreeConfig(*map(int, t.split("x"))) for t in (args.tree or ["6x6x40"])]
    drafters = {name: FoveaDrafter.from_pretrained(path, adapter).eval()
                for name, path in (d.split("=", 1) for d in args.drafter)}
    batches = args.batch or [1]

    ar, ar_s = run(adapter, None, TreeConfig(), requests, 1, eos, capacity)
    ar_tok = {r.key: r.sequences[0].tolist() for r in ar}
    ar_lat = {r.key: r.decode_s + r.prefill_s for r in ar}
    print(f"AR batch 1: {sum(len(v) for v in ar_tok.values()) / ar_s:.1f} tokens/s over {len(ar)} samples")
    for name, drafter in drafters.items():
        for tree in trees:
            res, spec_s = run(adapter, drafter, tree, requests, 1, eos, capacity)
            assert all(r.sequences[0].tolist() == ar_tok[r.key] for r in res), "not lossless"
            per = defaultdict(lambda: [0, 0, 0.0, 0.0])  # committed after the first, steps, spec s, AR s
            for r in res:
                p = per[r.key[0]]
                p[0] += r.sequences.shape[1] - 1
                p[1] += r.steps
                p[2] += r.decode_s + r.prefill_s
                p[3] += ar_lat[r.key]
            print(f"\n{name} tree {tree.width}x{tree.depth}x{tree.budget}: batch-1 latency speedup "
                  f"{ar_s / spec_s:.2f}x")
            print(f"{'task':12s} {'tau':>5s} {'MAT':>5s} {'speedup':>8s}")
            for task in TASKS:
                c, n, s_spec, s_ar = per[task]
                print(f"{task:12s} {c / max(n, 1):5.2f} {c / max(n, 1) - 1:5.2f} {s_ar / s_spec:8.2f}")
            c, n = sum(p[0] for p in per.values()), sum(p[1] for p in per.values())
            print(f"{'all':12s} {c / max(n, 1):5.2f} {c / max(n, 1) - 1:5.2f} {ar_s / spec_s:8.2f}")
            for b in batches:
                if b == 1:
                    continue
                _, ar_b = run(adapter, None, TreeConfig(), requests, b, eos, capacity)
                _, sp_b = run(adapter, drafter, tree, requests, b, eos, capacity)
                n_tok = sum(len(v) for v in ar_tok.values())
                print(f"  batch {b:3d}: AR {n_tok / ar_b:7.1f} tok/s, {name} {n_tok / sp_b:7.1f} tok/s, "
                      f"ratio {ar_b / sp_b:.2f}x")


if __name__ == "__main__":
    main()
