"""Which answer tokens does a reference target get right? Teacher-forced, by kind (copied from
the question, read from the image, the rest): `spec_core.reference.vlm.answer_kinds`.

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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_core.reference import hires  # noqa: E402
from spec_core.reference import tasks as small  # noqa: E402
from spec_core.reference.vlm.answer_kinds import answer_kind_accuracy, kind_table  # noqa: E402
from spec_core.reference.vlm.build import load_target  # noqa: E402


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
    samples = [s for task in args.tasks for s in world.make_split(task, args.per_task, args.seed, "eval")]
    acc = answer_kind_accuracy(model, proc, samples)
    print(f"{args.target}: teacher-forced answer-token accuracy ({args.per_task} held-out samples per task)")
    print(kind_table(acc, args.tasks))


if __name__ == "__main__":
    main()
