"""Where FOVEA's visual retrieval looks on the hires world: per corrected draft depth, the entries
each draft state reads (k), the softmax mass they hold (Eq. 6's mass reached) and, for turns whose
answer is read from named panels (region questions, reasoning over two panels, multi-turn), the
share of the readout's weight on those panels' visual tokens - against their share of the image
(chance) and against the dense softmax (what the query scores before the cumulative-mass cut).

    python scripts/retrieval_stats.py --target runs/reference/hires/target \\
        --drafter fovea=runs/demo/train_drafter/reference-hires-hraw/drafter [--drafter name=dir ...] \\
        [--per-task 30] [--out stats.json]

States are the training unroll's (teacher-forced on the held-out split's reference answers, every
assistant token), so every drafter is read on the same positions. A caption turn names every
panel; its states are counted in k and mass but not in the panel shares. docs/results.md (the
hires world) has the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_core.fovea import DraftSample, FoveaDrafter, collate  # noqa: E402
from spec_core.fovea.retrieval_stats import retrieval_by_depth  # noqa: E402
from spec_core.reference.hires import make_split  # noqa: E402
from spec_core.reference.hires.layout import sample_region_tokens  # noqa: E402
from spec_core.reference.tasks import TASKS  # noqa: E402
from spec_core.targets import load_target  # noqa: E402
from spec_core.targets.encode import align_to_expanded, assistant_spans, encode_with_mask  # noqa: E402


def teacher_forced(adapter, processor, sample: dict) -> tuple[DraftSample, list[tuple[int, int]]]:
    """The sample's whole conversation through the target: a drafter sample and its answer spans."""
    tok = processor.tokenizer
    image = Image.open(io.BytesIO(sample["image_png"])).convert("RGB")
    text = tok.apply_chat_template(sample["conversation"], tokenize=False)
    inputs = dict(processor(text=text, images=image, add_special_tokens=False, return_tensors="pt"))
    ids = inputs["input_ids"][0]
    plain, mask = encode_with_mask(tok, sample["conversation"])
    mask_T = torch.tensor(align_to_expanded(plain, mask, ids.tolist(), adapter.model.config.image_token_id))
    out = adapter.prefill(inputs)
    final = out.final_hidden_BTD[0]
    visual = out.visual_BPD[0][out.visual_valid_BP[0]]
    zero = torch.zeros(len(ids), dtype=torch.bool)
    return DraftSample(ids, mask_T, final, torch.zeros_like(final), zero, visual), assistant_spans(mask_T.tolist())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="a saved hires target directory (LLaVA-NeXT)")
    ap.add_argument("--drafter", action="append", required=True, help="name=directory of a saved FOVEA drafter")
    ap.add_argument("--per-task", type=int, default=30, help="held-out samples per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoProcessor

    adapter = load_target(args.target)
    processor = AutoProcessor.from_pretrained(args.target)
    vision = adapter.model.config.vision_config
    side = vision.image_size // vision.patch_size  # patches per tile side
    samples = [s for t in TASKS for s in make_split(t, args.per_task, args.seed, "eval")]
    data = [teacher_forced(adapter, processor, s) for s in samples]
    regions = [sample_region_tokens(s, side) for s in samples]
    report = {}
    for spec in args.drafter:
        name, path = spec.split("=", 1)
        drafter = FoveaDrafter.from_pretrained(path, adapter).eval()
        acc = defaultdict(lambda: defaultdict(list))
        for i in range(0, len(samples), args.batch):
            idx = list(range(i, min(i + args.batch, len(samples))))
            batch = collate([data[j][0] for j in idx])
            for r in retrieval_by_depth(drafter, batch):
                a = acc[r.depth]
                a["k"] += r.k_N.tolist()
                a["mass"] += r.mass_N.tolist()
                for n in range(len(r.k_N)):
                    j = idx[int(r.row_N[n])]
                    target_pos = int(r.pos_N[n]) + r.depth + 2
                    turn = next((u for u, (s0, s1) in enumerate(data[j][1]) if s0 <= target_pos < s1), None)
                    if turn is None or not isinstance(regions[j][turn], np.ndarray) or not len(regions[j][turn]):
                        continue
                    tokens = torch.as_tensor(regions[j][turn])
                    w, dense = r.weights_NP[n], r.dense_NP[n]
                    task = samples[j]["task"]
                    a[f"share/{task}"].append(float(w[tokens].sum()))
                    a[f"dense/{task}"].append(float(dense[tokens].sum()))
                    a[f"chance/{task}"].append(len(tokens) / data[j][0].visual.shape[0])
                    a[f"top1/{task}"].append(float(int(w.argmax()) in set(tokens.tolist())))
        report[name] = {d: {key: float(np.mean(v)) for key, v in a.items()} | {
            "k_hist": {int(k): int(c) for k, c in zip(*np.unique(a["k"], return_counts=True))}}
            for d, a in sorted(acc.items())}
    print_report(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


def print_report(report: dict) -> None:
    for name, depths in report.items():
        for d, fig in depths.items():
            print(f"\n{name}, depth {d}: k read {fig['k']:.2f} (histogram {fig['k_hist']}), mass reached {fig['mass']:.3f}")
            tasks = sorted({key.split("/", 1)[1] for key in fig if key.startswith("share/")})
            if tasks:
                print("| task | weight on the named panels | dense softmax there | chance | top entry there |")
                print("|---|---|---|---|---|")
                for t in tasks:
                    cells = " | ".join(f"{fig[f'{kind}/{t}']:.3f}" for kind in ("share", "dense", "chance", "top1"))
                    print(f"| {t} | {cells} |")


if __name__ == "__main__":
    main()
