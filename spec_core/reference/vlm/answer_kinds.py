"""Which answer tokens a reference target gets right, teacher-forced (one forward per held-out
sample: the gold answer so far, the next token predicted), by kind:

- copied: content words (a shape, a colour, a sign's word) that also stand in the question - the
  answer repeats them ("Tell me the colour of the cross ..." -> "The cross ... is blue");
- read: content words the question does not hold - read from the image;
- other: every other answer token (the templates' words, counts, bar labels).

Shapes: T positions.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from spec_core.reference.vlm.data import answer_runs, decode_png, encode_conversation
from spec_core.reference.vlm.model import image_inputs
from spec_core.reference.vocab import CONTENT_WORDS

KINDS = ("copied", "read", "other")


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


@torch.no_grad()
def answer_kind_accuracy(model, processor, samples: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """(task, kind) -> (predicted exactly, answer tokens) over `samples`."""
    tok = processor.tokenizer
    image_id = tok.convert_tokens_to_ids(processor.image_token)
    right, total = defaultdict(int), defaultdict(int)
    K = None  # placeholders per image: every image of a world has the same size
    for s in samples:
        image = decode_png(s["image_png"])
        if K is None:  # as the processor expands them
            K = int(processor(text=processor.image_token, images=image, return_tensors="pt")["input_ids"]
                    .eq(image_id).sum())
        ids, labels = encode_conversation(tok, list(s["conversation"]), K)
        pred_T = model(input_ids=torch.tensor([ids]), **image_inputs(processor, [image])).logits[0].argmax(-1)
        for pos, kind in token_kinds(tok, ids, labels):
            right[s["task"], kind] += int(pred_T[pos] == ids[pos + 1])
            total[s["task"], kind] += 1
    return {key: (right[key], total[key]) for key in total}


def kind_table(acc: dict[tuple[str, str], tuple[int, int]], tasks: list[str]) -> str:
    """The accuracies as a text table, a row per task."""
    lines = [f"{'task':12s} " + "  ".join(f"{k:>14s}" for k in KINDS)]
    for task in tasks:
        cells = []
        for k in KINDS:
            r, n = acc.get((task, k), (0, 0))
            cells.append(f"{r / n:.2f} of {n:4d}" if n else "-")
        lines.append(f"{task:12s} " + "  ".join(f"{c:>14s}" for c in cells))
    return "\n".join(lines)
