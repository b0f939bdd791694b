"""Does a hires target look at the panel a question names? Per decoder layer, over held-out
one-panel questions (general VQA and sign reading, whose `scene_json` names the panel read): the
named tile's share of the attention that the answer positions give the nine tiles (uniform: 1/9),
and how often it is the tile with the most.

    python scripts/hires_attention.py runs/reference/hires/target [--per-task 60]

`--which-panel`: the content search instead. On held-out "Which panel has the sign that says X?"
questions, teacher-forced, at the position that predicts the panel's first word: how often the
first focus head (`vlm.train.focus_layers`, head 0) gives the panel holding the sign the most
attention (found), and how often the final logits name that word (right), when found and when
not - where text VQA's misses were traced (docs/results.md, the hires world).

    python scripts/hires_attention.py runs/reference/hires/target --which-panel [--per-task 250]

Layout read: `spec_core.reference.hires.layout` (LLaVA-NeXT's packing of the base view and tiles).
Shapes: H heads, A answer positions, K visual tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_core.reference import hires  # noqa: E402
from spec_core.reference.hires.layout import tile_of_tokens  # noqa: E402
from spec_core.reference.hires.mosaic import PANELS, mosaic_from_json  # noqa: E402
from spec_core.reference.vlm.build import load_target  # noqa: E402
from spec_core.reference.vlm.data import answer_runs, decode_png, encode_conversation  # noqa: E402
from spec_core.reference.vlm.model import image_inputs  # noqa: E402
from spec_core.reference.vlm.train import TRAIN_PRESETS, focus_layers  # noqa: E402


def attend(model, proc, s: dict, tiles: np.ndarray) -> tuple[list[int], list[int], object, int]:
    """One held-out sample, teacher-forced with every layer's attention weights: (ids, labels, the
    model's output, the position of the first image token)."""
    tok = proc.tokenizer
    ids, labels = encode_conversation(tok, list(s["conversation"]), len(tiles))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), **image_inputs(proc, [decode_png(s["image_png"])]),
                    output_attentions=True)
    return ids, labels, out, ids.index(tok.convert_tokens_to_ids(proc.image_token))


def tile_mass(mass_K: np.ndarray, tiles: np.ndarray) -> np.ndarray:
    """(9,) attention mass per tile, from the mass on each of the K visual tokens."""
    return np.array([mass_K[tiles == t].sum() for t in range(PANELS * PANELS)])


def which_panel(model, proc, tiles: np.ndarray, per_task: int, seed: int) -> dict:
    """Found / right at the panel's first word of "The sign that says X is in the <panel> panel."
    (see the module doc); over the sign-panel questions among `per_task` held-out text VQA samples."""
    K = len(tiles)
    layer = focus_layers(model.config.text_config.num_hidden_layers, TRAIN_PRESETS["hires"].focus_layers)[0]
    found, right = [], []
    for s in hires.make_split("text_vqa", per_task, seed, "eval"):
        if "that says" not in s["answers"][0]:
            continue
        _, regions = mosaic_from_json(s["scene_json"])
        ids, labels, out, start = attend(model, proc, s, tiles)
        answer = [q for run in answer_runs(labels) for q in run]
        words = [proc.tokenizer.decode([ids[q + 1]]).strip() for q in answer]
        q = answer[max(i for i, w in enumerate(words) if w == "the") + 1]  # predicts the panel's first word
        found.append(tile_mass(out.attentions[layer][0, 0, q, start:start + K].numpy(), tiles).argmax()
                     == regions[0][0])
        right.append(out.logits[0, q].argmax().item() == ids[q + 1])
    f, r = np.array(found), np.array(right)
    return {"questions": len(f), "layer": layer, "found": int(f.sum()), "right": int(r.sum()),
            "right_when_found": round(float(r[f].mean()), 2) if f.any() else None,
            "right_when_not_found": round(float(r[~f].mean()), 2) if (~f).any() else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="a saved hires target directory")
    ap.add_argument("--per-task", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--which-panel", action="store_true", help="the content search of sign-panel questions")
    args = ap.parse_args()
    model, proc = load_target(args.target)
    model.set_attn_implementation("eager")  # attention weights are returned by the eager path only
    vision = model.config.vision_config
    tiles = tile_of_tokens(vision.image_size // vision.patch_size)
    K = len(tiles)
    if args.which_panel:
        print(json.dumps(which_panel(model, proc, tiles, args.per_task, args.seed)))
        return
    samples = [s for t in ("general_vqa", "text_vqa") for s in hires.make_split(t, args.per_task, args.seed, "eval")]
    L = model.config.text_config.num_hidden_layers
    wins, share = np.zeros(L), np.zeros(L)
    for s in samples:
        _, regions = mosaic_from_json(s["scene_json"])
        named = regions[0][0]
        _, labels, out, start = attend(model, proc, s, tiles)
        answer = [q for run in answer_runs(labels) for q in run]  # positions that predict answer tokens
        for layer, attn_1HTT in enumerate(out.attentions):
            per_tile = tile_mass(attn_1HTT[0][:, answer, start:start + K].mean((0, 1)).numpy(), tiles)
            wins[layer] += per_tile.argmax() == named
            share[layer] += per_tile[named] / max(per_tile.sum(), 1e-12)
    n = len(samples)
    print(f"{n} one-panel questions; uniform share {1 / PANELS ** 2:.3f}")
    print("layer  named tile's share  named tile has the most")
    for layer in range(L):
        print(f"{layer:5d}  {share[layer] / n:18.3f}  {wins[layer] / n:23.2f}")


if __name__ == "__main__":
    main()
