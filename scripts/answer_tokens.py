"""Which answer tokens does a reference target get right? Teacher-forced (one forward per held-out
sample: the gold answer so far, the next token predicted), the share predicted exactly, by kind:

- copied: content words (a shape, a colour, a sign's word) that also stand in the question - the
  answer repeats them ("Tell me the colour of the cross ..." -> "The cross ... is blue");
- read: content words the question does not hold - read from the image;
- other: every other answer token (the templates' words, counts, bar labels).

    python scripts/answer_tokens.py runs/reference/hires/target [--per-task 40] [--tasks general_vqa ...]

The world (small or hires) is the target's: a LLaVA-NeXT target is the hires world's. Measured on
2026-12-03 (40 held-out samples per task): the `small` target copies 1.00 of the copied words;
the first hires target with taught attention 0.08 (general VQA) and 0.00 (text VQA) - it says
"The square ..." for a question about the cross - while getting 0.97-1.00 of the other copied
tokens: see docs/results.md (the hires world).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_core.reference import hires  # noqa: E402
from spec_core.reference import tasks as small  # noqa: E402
from spec_core.reference.vlm.build import load_target  # noqa: E402
from spec_core.reference.vlm.data import answer_runs, decode_png, encode_conversation  # noqa: E402
from spec_core.reference.vlm.model import image_inputs  # noqa: E402
from spec_core.reference.vocab import CONTENT_WORDS  # noqa: E402


def token_kinds(tok, ids: list[int], labels: list[int]) -> list[tuple[int, str]]:
    """(position predicting it, kind) of every answer token (`answer_runs`' positions, the focus
    loss's own); the question is what precedes the first answer."""
    runs = [q for run in answer_runs(labels) for q in run]
    question = set(ids[: runs[0] + 1]) if runs else set()
    out = []
    for q in runs:
        word = tok.decode([ids[q + 1]]).strip().lower()
        out.append((q, "other" if word not in CONTENT_WORDS else ("copied" if ids[q + 1] in question else "read")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="a saved reference target directory")
    ap.add_argument("--per-task", type=int, default=40)
    ap.add_argument("--tasks", nargs="+", default=["general_vqa", "text_vqa", "chart_vqa"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, proc = load_target(args.target)
    world = hires if type(model).__name__.startswith("LlavaNext") else small
    tok = proc.tokenizer
    image_id = tok.convert_tokens_to_ids(proc.image_token)
    right, total = defaultdict(int), defaultdict(int)
    K = None  # placeholders per image: every image of a world has the same size
    for task in args.tasks:
        for s in world.make_split(task, args.per_task, args.seed, "eval"):
            image = decode_png(s["image_png"])
            if K is None:  # as the processor expands them
                K = int(proc(text=proc.image_token, images=image, return_tensors="pt")["input_ids"].eq(image_id).sum())
            ids, labels = encode_conversation(tok, list(s["conversation"]), K)
            with torch.no_grad():
                pred_T = model(input_ids=torch.tensor([ids]), **image_inputs(proc, [image])).logits[0].argmax(-1)
            for pos, kind in token_kinds(tok, ids, labels):
                right[task, kind] += int(pred_T[pos] == ids[pos + 1])
                total[task, kind] += 1
    print(f"{args.target}: teacher-forced answer-token accuracy ({args.per_task} held-out samples per task)")
    print(f"{'task':12s} " + "  ".join(f"{k:>14s}" for k in ("copied", "read", "other")))
    for task in args.tasks:
        cells = [f"{right[task, k] / total[task, k]:.2f} of {total[task, k]:4d}" if total[task, k] else "-"
                 for k in ("copied", "read", "other")]
        print(f"{task:12s} " + "  ".join(f"{c:>14s}" for c in cells))


if __name__ == "__main__":
    main()
