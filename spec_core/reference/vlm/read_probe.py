"""Where a hires target's reading fails, measured at the answer positions that predict a word read
from the image (`hires.reads`: the colour of the named object, a sign's word, a bar's value):

- attention: per decoder layer and head, the attention mass on the patches that show the word;
- what the decoder could read: a ridge probe of the word from the patch tokens themselves (the
  projector's output, the decoder's input at those patches, mean over them);
- what it has read: the same probe from the residual stream at the answer position after each
  layer (0 = the input embedding of the token before the word);
- and teacher-forced, whether the next token is the word's.

A route that works shows the probe rising towards the patches' level in the residual after the
reading layers; attention that is right with a residual that does not rise says the heads'
outputs do not carry what they attend to (measured so on the hires proxy: docs/results.md).

Shapes: P read positions, L decoder layers, H heads, D hidden size.
"""

from __future__ import annotations


import numpy as np
import torch

from spec_core.reference.hires.reads import sample_read_tokens
from spec_core.reference.vlm.data import TaskPool, read_pairs, token_words
from spec_core.reference.vlm.model import PRESETS


def ridge_probe(X_PD: torch.Tensor, y_P: torch.Tensor, lam: float = 30.0, train_share: float = 0.7,
                seed: int = 0) -> tuple[float, float]:
    """(held-out accuracy, chance = the held-out share of the most common class) of a ridge
    regression onto one-hot classes over standardised features; (nan, nan) where fewer than 10
    samples or one class."""
    n = len(y_P)
    if n < 10 or len(set(y_P.tolist())) < 2:
        return float("nan"), float("nan")
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    tr, te = perm[: int(train_share * n)], perm[int(train_share * n):]
    X = X_PD.double()
    X = (X - X[tr].mean(0)) / (X[tr].std(0) + 1e-6)
    X = torch.cat([X, torch.ones(n, 1, dtype=torch.float64)], 1)
    classes, y = torch.unique(y_P, return_inverse=True)
    Y = torch.nn.functional.one_hot(y, len(classes)).double()
    W = torch.linalg.solve(X[tr].T @ X[tr] + lam * torch.eye(X.shape[1], dtype=torch.float64), X[tr].T @ Y[tr])
    acc = float(((X[te] @ W).argmax(1) == y[te]).double().mean())
    return acc, float(torch.bincount(y[te]).max()) / len(te)


@torch.no_grad()
def read_positions(model, processor, samples: list[dict], preset: str = "hires") -> dict:
    """Every read position of `samples` (one forward each, eager attention): {"words": [P],
    "mass_PLH", "patches_PD" (the decoder's input at the word's patches, mean), "residual_LPD"
    (after each layer, 0 = input), "correct_P" (teacher-forced)}."""
    size = PRESETS[preset]
    side = size.image_size // size.patch
    pool = TaskPool.build(samples, processor, size.n_image_tokens)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    stop_id = processor.tokenizer.convert_tokens_to_ids(".")
    top = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the one implementation that returns attention weights
    words, mass, patches, residual, correct = [], [], [], [], []
    try:
        by_task = {t: [s for s in samples if s["task"] == t] for t in pool.examples}
        for task, examples in pool.examples.items():
            for (row, ids, labels), sample in zip(examples, by_task[task]):
                tw = token_words(processor.tokenizer, ids)
                pairs = read_pairs(ids, labels, image_id, tw, sample_read_tokens(sample, side=side), stop_id)
                if not pairs:
                    continue
                out = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            **{k: v[row: row + 1] for k, v in pool.images.items()},
                            output_attentions=True, output_hidden_states=True)
                for q_1, keys in pairs:
                    q = int(q_1[0])
                    k = torch.as_tensor(keys)
                    words.append(tw[q + 1])
                    mass.append(torch.stack([a[0, :, q, k].sum(-1) for a in out.attentions]))
                    patches.append(out.hidden_states[0][0, k].mean(0))
                    residual.append(torch.stack([h[0, q] for h in out.hidden_states]))
                    correct.append(int(out.logits[0, q].argmax()) == ids[q + 1])
    finally:
        model.set_attn_implementation(top)
    if not words:
        return {"words": [], "mass_PLH": torch.zeros(0), "patches_PD": torch.zeros(0),
                "residual_LPD": torch.zeros(0), "correct_P": torch.zeros(0, dtype=torch.bool)}
    return {"words": words, "mass_PLH": torch.stack(mass), "patches_PD": torch.stack(patches),
            "residual_LPD": torch.stack(residual, 1), "correct_P": torch.tensor(correct)}


def probe_report(reads: dict, groups: dict[str, frozenset[str]], lam: float = 30.0) -> dict:
    """Per group of words (e.g. colours, shapes): positions, teacher-forced accuracy, and probe
    accuracy (with its chance) from the patches and from the residual after each layer."""
    out = {}
    for name, group in groups.items():
        sel = [i for i, w in enumerate(reads["words"]) if w in group]
        if not sel:
            continue
        idx = torch.tensor(sel)
        vocab = sorted({reads["words"][i] for i in sel})
        y = torch.tensor([vocab.index(reads["words"][i]) for i in sel])
        acc, chance = ridge_probe(reads["patches_PD"][idx], y, lam)
        out[name] = {"positions": len(sel), "teacher_forced": float(reads["correct_P"][idx].double().mean()),
                     "chance": chance, "probe_patches": acc,
                     "probe_residual": [ridge_probe(r[idx], y, lam)[0] for r in reads["residual_LPD"]]}
    return out
