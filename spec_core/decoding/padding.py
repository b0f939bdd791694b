"""Per-request processor outputs (batch 1 each) -> one left-padded batch, as HF's processors pad
a batch for generation: the engine's batched admission and HFEngine prefill with it.

Shapes: R requests, T prompt tokens (left-padded to the longest).
"""

from __future__ import annotations

import torch

PER_TOKEN = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")  # (1, T) each


def pad_batch(inputs: list[dict], pad_id: int) -> dict:
    """The per-token tensors (PER_TOKEN) left-padded (ids with pad_id, the rest with 0); everything
    else (pixel values, image sizes, grids) concatenated along its first dimension in request
    order, trailing dimensions zero-padded to the largest (LLaVA-NeXT's views per image: the model
    reads only the views its image_sizes imply)."""
    from spec_core.targets.encode import collate_image_inputs

    lengths = [int(x["input_ids"].shape[-1]) for x in inputs]
    T = max(lengths)
    out = {}
    for key in inputs[0]:
        if key in PER_TOKEN:
            fill = pad_id if key == "input_ids" else 0
            out[key] = torch.cat([torch.nn.functional.pad(torch.as_tensor(x[key]), (T - n, 0), value=fill)
                                  for x, n in zip(inputs, lengths)])
    rest = [{k: torch.as_tensor(v).numpy() for k, v in x.items() if k not in PER_TOKEN} for x in inputs]
    if rest[0]:  # images: concatenated, trailing dimensions zero-padded (the precompute collate)
        out.update(collate_image_inputs(rest))
    if "attention_mask" not in out:
        out["attention_mask"] = torch.stack([torch.arange(T) >= T - n for n in lengths]).long()
    return out


def pad_id_for(adapter) -> int:
    """A token id for left padding (never attended): the checkpoint's pad id, else 0 - but never
    the image placeholder, which the model would try to fill with image features."""
    cfg = adapter.model.generation_config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else adapter.text_config.pad_token_id
    for cand in (pad, 0, 1):
        if cand is not None and int(cand) != adapter.image_token_id:
            return int(cand)
    raise AssertionError("unreachable: 0 and 1 cannot both be the image token")
