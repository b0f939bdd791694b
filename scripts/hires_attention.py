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

`--panel-probe`: on the same questions and position, what the focus heads' output says of the
panel. A linear probe (logistic regression, fit on two thirds of the questions, scored on the rest;
chance 1/9) decodes the sign's panel from each focus head's output (its attention-weighted values),
from the part of it that comes from the sign's tile, and from the plain mean of the values of that
tile's tokens; and, as a control, each visual token's tile from its value alone (tokens of the same
images). Where the values carry the tile and the head's output does not, the head reads what
the tile says, not where it is.

    python scripts/hires_attention.py runs/reference/hires/target --panel-probe [--per-task 1500]

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
from spec_core.reference.vlm.train import TRAIN_PRESETS, HeadOutputs, focus_layers  # noqa: E402


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


def panel_position(proc, ids: list[int], labels: list[int]) -> int:
    """The position that predicts the panel's first word of "... is in the <panel> panel."."""
    answer = [q for run in answer_runs(labels) for q in run]
    words = [proc.tokenizer.decode([ids[q + 1]]).strip() for q in answer]
    return answer[max(i for i, w in enumerate(words) if w == "the") + 1]


def sign_panel_questions(per_task: int, seed: int) -> list[dict]:
    """The "which panel has the sign that says X" samples among `per_task` held-out text VQA samples."""
    return [s for s in hires.make_split("text_vqa", per_task, seed, "eval") if "that says" in s["answers"][0]]


def which_panel(model, proc, tiles: np.ndarray, per_task: int, seed: int) -> dict:
    """Found / right at the panel's first word of "The sign that says X is in the <panel> panel."
    (see the module doc); over the sign-panel questions among `per_task` held-out text VQA samples."""
    K = len(tiles)
    layer = focus_layers(model.config.text_config.num_hidden_layers, TRAIN_PRESETS["hires"].focus_layers)[0]
    found, right = [], []
    for s in sign_panel_questions(per_task, seed):
        _, regions = mosaic_from_json(s["scene_json"])
        ids, labels, out, start = attend(model, proc, s, tiles)
        q = panel_position(proc, ids, labels)
        found.append(tile_mass(out.attentions[layer][0, 0, q, start:start + K].numpy(), tiles).argmax()
                     == regions[0][0])
        right.append(out.logits[0, q].argmax().item() == ids[q + 1])
    f, r = np.array(found), np.array(right)
    return {"questions": len(f), "layer": layer, "found": int(f.sum()), "right": int(r.sum()),
            "right_when_found": round(float(r[f].mean()), 2) if f.any() else None,
            "right_when_not_found": round(float(r[~f].mean()), 2) if (~f).any() else None}


def probe_accuracy(X_NF: torch.Tensor, y_N: torch.Tensor, seed: int, steps: int = 400) -> float:
    """Held-out accuracy of a linear probe (features standardised, L2-regularised logistic regression
    with Adam) fit on two thirds of the N rows, scored on the last third."""
    n_fit = len(y_N) * 2 // 3
    order = torch.randperm(len(y_N), generator=torch.Generator().manual_seed(seed))
    fit, held = order[:n_fit], order[n_fit:]
    X_NF = (X_NF - X_NF[fit].mean(0)) / (X_NF[fit].std(0) + 1e-5)
    classes = int(y_N.max()) + 1
    W = torch.zeros(X_NF.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.Adam([W, b], lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        (torch.nn.functional.cross_entropy(X_NF[fit] @ W + b, y_N[fit]) + 1e-2 * W.pow(2).sum()).backward()
        opt.step()
    return round(float(((X_NF[held] @ W + b).argmax(1) == y_N[held]).float().mean()), 3)


def panel_probe(model, proc, tiles: np.ndarray, per_task: int, seed: int) -> dict:
    """What the focus heads' output at the panel's first word says of the sign's panel (module doc).
    Shapes: N questions, T positions, E head dim."""
    cfg = model.config.text_config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    E = cfg.hidden_size // n_heads
    heads = [(layer, h) for layer in focus_layers(cfg.num_hidden_layers, TRAIN_PRESETS["hires"].focus_layers)
             for h in range(TRAIN_PRESETS["hires"].focus_heads)]
    kinds = ("output", "sign_tile_part", "tile_mean", "token")
    feats = {(kind, lh): [] for kind in kinds for lh in heads}
    panels, right = [], []
    for s in sign_panel_questions(per_task, seed):
        _, regions = mosaic_from_json(s["scene_json"])
        panel = regions[0][0]
        with HeadOutputs(model, sorted({layer for layer, _ in heads}), values=True) as captured:
            ids, labels, out, start = attend(model, proc, s, tiles)
        q = panel_position(proc, ids, labels)
        tile_T = torch.zeros(len(ids), dtype=torch.bool)
        tile_T[start + np.flatnonzero(tiles == panel)] = True
        # the control's row: one visual token of this image, its tile and its place in the tile in turn
        cells = np.flatnonzero(tiles == len(panels) % (PANELS * PANELS))
        token = start + cells[len(panels) // (PANELS * PANELS) % len(cells)]
        for layer, h in heads:
            kv = h // (n_heads // n_kv)
            v_TE = captured.values[layer][0, :, kv * E:(kv + 1) * E]
            a_T = out.attentions[layer][0, h, q]
            feats["output", (layer, h)].append(a_T @ v_TE)
            feats["sign_tile_part", (layer, h)].append((a_T * tile_T) @ v_TE)
            feats["tile_mean", (layer, h)].append(v_TE[tile_T].mean(0))
            feats["token", (layer, h)].append(v_TE[token])
        panels.append(panel)
        right.append(out.logits[0, q].argmax().item() == ids[q + 1])
    y_N = torch.tensor(panels)
    y_token = torch.arange(len(panels)) % (PANELS * PANELS)
    probes = {f"layer {layer} head {h}": {kind: probe_accuracy(torch.stack(feats[kind, (layer, h)]),
                                                               y_token if kind == "token" else y_N, seed)
                                          for kind in kinds}
              for layer, h in heads}
    return {"questions": len(panels), "chance": round(1 / PANELS ** 2, 3),
            "first_word_right": round(float(np.mean(right)), 3), "probe": probes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="a saved hires target directory")
    ap.add_argument("--per-task", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--which-panel", action="store_true", help="the content search of sign-panel questions")
    ap.add_argument("--panel-probe", action="store_true", help="what the focus heads' output says of the panel")
    args = ap.parse_args()
    model, proc = load_target(args.target)
    model.set_attn_implementation("eager")  # attention weights are returned by the eager path only
    vision = model.config.vision_config
    tiles = tile_of_tokens(vision.image_size // vision.patch_size)
    K = len(tiles)
    if args.which_panel or args.panel_probe:
        report = (which_panel if args.which_panel else panel_probe)(model, proc, tiles, args.per_task, args.seed)
        print(json.dumps(report))
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
