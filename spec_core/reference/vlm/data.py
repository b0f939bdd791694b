"""Encode reference samples for the target VLM: chat template, `<image>` expanded to one
placeholder per image feature (as LlavaProcessor does), labels only on assistant spans.

Shapes: B batch, T positions, C=3, H=W image size.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast

from spec_core.reference.vlm.model import pixels
from spec_core.targets.encode import encode_with_mask, expand_image_tokens

IGNORE = -100


def encode_conversation(tok: PreTrainedTokenizerFast, conversation: list[dict], n_patches: int,
                        ) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a whole conversation; labels are IGNORE outside assistant spans."""
    ids, mask = encode_with_mask(tok, conversation)
    image_id = tok.convert_tokens_to_ids("<image>")
    ids, mask = expand_image_tokens(ids, mask, image_id, [n_patches] * ids.count(image_id))
    return ids, [t if m else IGNORE for t, m in zip(ids, mask)]


def encode_prompt(tok: PreTrainedTokenizerFast, turns: list[dict], n_patches: int) -> list[int]:
    """Prompt ids for generation: the conversation so far plus the assistant header."""
    ids = tok.apply_chat_template(turns, tokenize=True, add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    image_id = tok.convert_tokens_to_ids("<image>")
    return expand_image_tokens(ids, [False] * len(ids), image_id, [n_patches] * ids.count(image_id))[0]


def decode_png(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@dataclass
class TaskPool:
    """Pre-encoded training examples, batched by task so that padding stays small."""

    pixel_values: torch.Tensor            # (N, C, H, W), one image per sample
    examples: dict[str, list[tuple[int, list[int], list[int]]]]  # task -> (sample, ids, labels)
    pad_id: int

    @classmethod
    def build(cls, samples: list[dict], tok: PreTrainedTokenizerFast, n_patches: int) -> TaskPool:
        pv = pixels([decode_png(s["image_png"]) for s in samples])
        ex: dict[str, list] = {}
        for i, s in enumerate(samples):
            ids, labels = encode_conversation(tok, list(s["conversation"]), n_patches)
            ex.setdefault(s["task"], []).append((i, ids, labels))
        return cls(pv, ex, tok.pad_token_id)

    def batch(self, task: str, size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """A random right-padded training batch of one task."""
        pool = self.examples[task]
        picks = [pool[j] for j in rng.integers(0, len(pool), size)]
        width = max(len(ids) for _, ids, _ in picks)
        ids_BT = torch.full((size, width), self.pad_id, dtype=torch.long)
        labels_BT = torch.full((size, width), IGNORE, dtype=torch.long)
        mask_BT = torch.zeros((size, width), dtype=torch.long)
        for b, (_, ids, labels) in enumerate(picks):
            ids_BT[b, : len(ids)] = torch.tensor(ids)
            labels_BT[b, : len(ids)] = torch.tensor(labels)
            mask_BT[b, : len(ids)] = 1
        images = torch.tensor([i for i, _, _ in picks])
        return {"input_ids": ids_BT, "attention_mask": mask_BT, "labels": labels_BT,
                "pixel_values": self.pixel_values[images]}
