"""Encode reference samples for the target VLM: chat template, `<image>` expanded to one
placeholder per image feature (as LlavaProcessor does), labels only on assistant spans.

Shapes: B batch, T positions, V views of an AnyRes image, C=3, H=W image size.
"""

from __future__ import annotations

import io
from collections.abc import Callable
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


def answer_runs(labels: list[int]) -> list[list[int]]:
    """Per assistant turn, the positions whose next token is one of its labelled tokens (the
    positions a model predicts the answer at), in turn order."""
    runs: list[list[int]] = []
    for i in range(1, len(labels)):
        if labels[i] == IGNORE:
            continue
        if labels[i - 1] == IGNORE or not runs:
            runs.append([])
        runs[-1].append(i - 1)
    return runs


def focus_pairs(ids: list[int], labels: list[int], image_id: int, keys_per_turn: list[np.ndarray],
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(query positions, key positions) per turn that has keys: the positions predicting the
    turn's answer, and the image tokens it reads (`keys_per_turn`: indices among the image's
    placeholders, one entry per assistant turn)."""
    runs = answer_runs(labels)
    if len(runs) != len(keys_per_turn):
        raise ValueError(f"{len(runs)} assistant turns but regions for {len(keys_per_turn)}")
    start = ids.index(image_id)
    return [(np.array(q), start + k) for q, k in zip(runs, keys_per_turn) if len(k)]


@dataclass
class TaskPool:
    """Pre-encoded training examples, batched by task so that padding stays small; the image side
    is held once per distinct image (the hires world asks six questions of each). With `focus`,
    each example also lists, per answer, the image tokens it should read (the hires world's
    region panels) and batches carry them as `focus_BTT` (query position x key position)."""

    images: dict[str, torch.Tensor]       # pixel_values (N, C, H, W) or (N, V, C, H, W) [+ image_sizes (N, 2)]
    examples: dict[str, list[tuple[int, list[int], list[int]]]]  # task -> (image row, ids, labels)
    pad_id: int
    focus: dict[str, list[list[tuple[np.ndarray, np.ndarray]]]] | None = None  # task -> per example

    @classmethod
    def build(cls, samples: list[dict], processor, n_image_tokens: int,
              focus: Callable[[dict], list[np.ndarray]] | None = None) -> TaskPool:
        """`focus(sample)`: per assistant turn, the indices of the image tokens its answer reads."""
        rows: dict[str, int] = {}
        pngs = []
        for s in samples:
            if s["image_sha256"] not in rows:
                rows[s["image_sha256"]] = len(pngs)
                pngs.append(s["image_png"])
        images = image_inputs(processor, [decode_png(b) for b in pngs])
        ex: dict[str, list] = {}
        foc: dict[str, list] = {}
        image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
        for s in samples:
            ids, labels = encode_conversation(processor.tokenizer, list(s["conversation"]), n_image_tokens)
            ex.setdefault(s["task"], []).append((rows[s["image_sha256"]], ids, labels))
            if focus is not None:
                foc.setdefault(s["task"], []).append(focus_pairs(ids, labels, image_id, focus(s)))
        return cls(images, ex, processor.tokenizer.pad_token_id, foc if focus is not None else None)

    def batch(self, task: str, size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """A random right-padded training batch of one task."""
        pool = self.examples[task]
        js = rng.integers(0, len(pool), size)
        picks = [pool[j] for j in js]
        width = max(len(ids) for _, ids, _ in picks)
        ids_BT = torch.full((size, width), self.pad_id, dtype=torch.long)
        labels_BT = torch.full((size, width), IGNORE, dtype=torch.long)
        mask_BT = torch.zeros((size, width), dtype=torch.long)
        for b, (_, ids, labels) in enumerate(picks):
            ids_BT[b, : len(ids)] = torch.tensor(ids)
            labels_BT[b, : len(ids)] = torch.tensor(labels)
            mask_BT[b, : len(ids)] = 1
        rows = torch.tensor([i for i, _, _ in picks])
        out = {"input_ids": ids_BT, "attention_mask": mask_BT, "labels": labels_BT,
               **{k: v[rows] for k, v in self.images.items()}}
        if self.focus is not None:
            focus_BTT = torch.zeros((size, width, width), dtype=torch.bool)
            for b, j in enumerate(js):
                for q, k in self.focus[task][j]:
                    focus_BTT[b, torch.from_numpy(q)[:, None], torch.from_numpy(k)[None, :]] = True
            out["focus_BTT"] = focus_BTT
        return out
