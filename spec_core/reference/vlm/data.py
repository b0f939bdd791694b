"""Encode reference samples for the target VLM: chat template, `<image>` expanded to one
placeholder per image feature (as LlavaProcessor does), labels only on assistant spans.

Shapes: B batch, T positions, V views of an AnyRes image, C=3, H=W image size.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast

from spec_core.reference.vlm.model import image_inputs
from spec_core.targets.encode import encode_with_mask, expand_image_tokens

IGNORE = -100


def encode_conversation(tok: PreTrainedTokenizerFast, conversation: list[dict], n_image_tokens: int,
                        ) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a whole conversation; labels are IGNORE outside assistant spans."""
    ids, mask = encode_with_mask(tok, conversation)
    image_id = tok.convert_tokens_to_ids("<image>")
    ids, mask = expand_image_tokens(ids, mask, image_id, [n_image_tokens] * ids.count(image_id))
    return ids, [t if m else IGNORE for t, m in zip(ids, mask)]


def encode_prompt(tok: PreTrainedTokenizerFast, turns: list[dict], n_image_tokens: int) -> list[int]:
    """Prompt ids for generation: the conversation so far plus the assistant header."""
    ids = tok.apply_chat_template(turns, tokenize=True, add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    image_id = tok.convert_tokens_to_ids("<image>")
    return expand_image_tokens(ids, [False] * len(ids), image_id, [n_image_tokens] * ids.count(image_id))[0]


def image_token_count(processor, image: Image.Image) -> int:
    """Placeholders the processor expands one image into (16 for the small world's LLaVA, 172 for
    a 192 px hires image on its LLaVA-NeXT)."""
    ids = processor(text=processor.image_token, images=image, add_special_tokens=False)["input_ids"][0]
    return list(ids).count(processor.tokenizer.convert_tokens_to_ids(processor.image_token))


def decode_png(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@dataclass
class TaskPool:
    """Pre-encoded training examples, batched by task so that padding stays small; the image side
    is held once per distinct image (the hires world asks six questions of each)."""

    images: dict[str, torch.Tensor]       # pixel_values (N, C, H, W) or (N, V, C, H, W) [+ image_sizes (N, 2)]
    examples: dict[str, list[tuple[int, list[int], list[int]]]]  # task -> (image row, ids, labels)
    pad_id: int

    @classmethod
    def build(cls, samples: list[dict], processor, n_image_tokens: int) -> TaskPool:
        rows: dict[str, int] = {}
        pngs = []
        for s in samples:
            if s["image_sha256"] not in rows:
                rows[s["image_sha256"]] = len(pngs)
                pngs.append(s["image_png"])
        images = image_inputs(processor, [decode_png(b) for b in pngs])
        ex: dict[str, list] = {}
        for s in samples:
            ids, labels = encode_conversation(processor.tokenizer, list(s["conversation"]), n_image_tokens)
            ex.setdefault(s["task"], []).append((rows[s["image_sha256"]], ids, labels))
        return cls(images, ex, processor.tokenizer.pad_token_id)

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
        rows = torch.tensor([i for i, _, _ in picks])
        return {"input_ids": ids_BT, "attention_mask": mask_BT, "labels": labels_BT,
                **{k: v[rows] for k, v in self.images.items()}}
