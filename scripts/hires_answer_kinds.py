"""Where a hires target's exact match is lost: held-out greedy answers (every turn, the reference
turns before it as history) grouped by the answer template they follow - the small world's
templates phrased for a panel ("The bars are {colour}.", "Yes, bar {a} is taller than bar {b}.")
and the hires world's own ("The sign that says {word} is in the {panel} panel.").

    python scripts/hires_answer_kinds.py runs/reference/hires/target [--tasks general_vqa text_vqa chart_vqa] \
        [--per-task 100] [--split eval] [--threads 1]

Prints one line per task, template -> right / answers, then a JSON line with the same figures and
up to `--examples` misses per template (reference, answer). An answer that follows no one-line
template (captions, reasoning) counts as "other". docs/results.md (the hires world) has figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_core.reference import hires  # noqa: E402
from spec_core.reference import templates as small  # noqa: E402
from spec_core.reference.hires import templates as hires_templates  # noqa: E402
from spec_core.reference.hires.reads import answer_pattern  # noqa: E402
from spec_core.reference.hires.tasks import panel_words  # noqa: E402
from spec_core.reference.vlm.build import load_target  # noqa: E402
from spec_core.reference.vlm.evaluate import generate_turns  # noqa: E402

TEMPLATES = {**{k: panel_words(t) for k, t in small.ANSWERS.items()}, **hires_templates.ANSWERS}
# the template with the most literal text first: "The {obj} is directly {rel} the {colour} {shape}."
# before "The {shape} {pos} is {colour}.", which would match it too
PATTERNS = [(k, answer_pattern(TEMPLATES[k]))
            for k in sorted(TEMPLATES, key=lambda k: (-len(re.sub(r"\{\w+\}", "", TEMPLATES[k])), k))]


def template_of(answer: str) -> str:
    """The key of the first template (most literal text first) whose pattern the answer fully matches."""
    return next((k for k, p in PATTERNS if p.fullmatch(answer)), "other")


def by_template(samples: list[dict], answers: list[list[str]], examples: int = 3) -> dict:
    """template -> {"right", "answers", "misses": [(reference, answer), ...]} over every turn."""
    out: dict = defaultdict(lambda: {"right": 0, "answers": 0, "misses": []})
    for s, got in zip(samples, answers):
        for ref, ans in zip(s["answers"], got):
            row = out[template_of(ref)]
            row["answers"] += 1
            row["right"] += ans == ref
            if ans != ref and len(row["misses"]) < examples:
                row["misses"].append((ref, ans))
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="a saved hires target directory (LLaVA-NeXT)")
    ap.add_argument("--tasks", nargs="+", default=["general_vqa", "text_vqa", "chart_vqa"])
    ap.add_argument("--per-task", type=int, default=100)
    ap.add_argument("--split", default="eval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, proc = load_target(args.target)
    report = {}
    for task in args.tasks:
        samples = hires.make_split(task, args.per_task, args.seed, args.split)
        report[task] = by_template(samples, generate_turns(model, proc, samples), args.examples)
        print(task, ", ".join(f"{k} {r['right']}/{r['answers']}" for k, r in report[task].items()))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
