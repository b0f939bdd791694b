"""Conversations -> target token ids with a loss mask on exactly the assistant tokens.

Two ways to find the assistant spans, so any chat template works:
- templates with `{% generation %}` blocks (the reference target's): HF's
  `return_assistant_tokens_mask`;
- any other template (LLaVA/Vicuna, Qwen ChatML, ...): render the conversation up to each
  assistant turn with `add_generation_prompt=True` and through that turn; the tokens the turn
  adds, up to its last special token (the end-of-turn token), are its span. A template whose
  shorter rendering is not a token prefix of the longer one cannot be masked this way: `EncodeError`
  (the caller rejects the sample with that reason).

Image placeholders stay one token each in the template; `expand_image_tokens` then repeats the
i-th one counts[i] times (one per projected visual token, as the HF processors do), carrying the
mask along, and `align_to_expanded` maps a mask onto ids a processor has already expanded.

Images -> model inputs without the model: `spec_core.targets.load_image_encoder(directory)` picks, by the saved
config's class, an encoder giving the tokenizer, the text that stands for one image, the image
arrays and the placeholder count per image (`ImageInputs`), and the per-token inputs `generate`
needs. LLaVA and LLaVA-NeXT use their saved HF processor (`ProcessorImageEncoder`); Qwen2.5-VL's
processor cannot be built without torchvision, so it has its own (`qwen2_5_vl.Qwen2_5_VLImageEncoder`).

Self-distillation and generation (`assistant_spans`, `splice_answer`): a target's own answer
replaces an assistant span token for token, so stored spans are exactly what the target
generated; `with_answer_slots` gives prompts-only conversations a span per user turn to replace.

Shapes: T tokens of one sample (lists, not tensors: this runs per sample in CPU workers),
B batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch
from transformers import PreTrainedConfig, PreTrainedTokenizerBase

MANIFEST_IMAGE = "<image>"  # how a manifest marks an image in a turn (jobs/_build_manifests/manifests.py)


class EncodeError(ValueError):
    """A conversation that cannot be encoded; the message is the reject reason."""


def _template_ids(tok: PreTrainedTokenizerBase, turns: Sequence[dict], generation_prompt: bool) -> list[int]:
    return list(tok.apply_chat_template(list(turns), tokenize=True, add_generation_prompt=generation_prompt,
                                        return_dict=True)["input_ids"])


def check_conversation(conversation: Sequence[dict]) -> None:
    """Roles alternate user/assistant (an optional system turn first), ending on the assistant."""
    turns = [t for t in conversation if t.get("role") != "system"]
    if not turns:
        raise EncodeError("empty conversation")
    for i, t in enumerate(turns):
        want = "user" if i % 2 == 0 else "assistant"
        if t.get("role") != want:
            raise EncodeError(f"turn {i} has role {t.get('role')!r}, expected {want!r}")
        if not isinstance(t.get("content"), str) or (want == "assistant" and not t["content"].strip()):
            raise EncodeError(f"turn {i} ({want}) has no text content")
    if turns[-1]["role"] != "assistant":
        raise EncodeError("conversation does not end with an assistant turn")


def with_answer_slots(conversation: Sequence[dict], slot: str = ".") -> list[dict]:
    """Every user turn that no assistant turn follows gets a stand-in answer `slot` after it, so
    that the roles alternate: a prompts-only row (MMSpec / MT-Bench `turns`: consecutive user
    turns) becomes one assistant span per prompt, each replaced in turn by a generated answer
    (`splice_answer`). Conversations that already alternate come back unchanged."""
    out = []
    for i, turn in enumerate(conversation):
        out.append(turn)
        after = conversation[i + 1].get("role") if i + 1 < len(conversation) else None
        if turn.get("role") == "user" and after != "assistant":
            out.append({"role": "assistant", "content": slot})
    return out


def encode_with_mask(tok: PreTrainedTokenizerBase, conversation: Sequence[dict]) -> tuple[list[int], list[bool]]:
    """(input_ids, loss_mask) of a whole conversation; mask True on assistant tokens (content and
    the template's end-of-turn token: what the model generates and stops on)."""
    check_conversation(conversation)
    if "{% generation %}" in (tok.chat_template or "") or "{%- generation %}" in (tok.chat_template or ""):
        out = tok.apply_chat_template(list(conversation), tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
    ids = _template_ids(tok, conversation, False)
    mask = [False] * len(ids)
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    for i, turn in enumerate(conversation):
        if turn["role"] != "assistant":
            continue
        before = _template_ids(tok, conversation[:i], True)
        through = _template_ids(tok, conversation[: i + 1], False)
        if through != ids[: len(through)] or before != through[: len(before)]:
            raise EncodeError(f"chat template is not prefix-stable at assistant turn {i}: "
                              "cannot find its tokens")
        start, end = len(before), len(through)
        # template text after the turn's last special token (ChatML's "\n" after <|im_end|>) is
        # not generated: generation stops at that token
        last = max((k for k in range(start, end) if ids[k] in special), default=end - 1)
        mask[start: last + 1] = [True] * (last + 1 - start)
    return ids, mask


def expand_image_tokens(ids: Sequence[int], mask: Sequence[bool], image_id: int,
                        counts: Sequence[int]) -> tuple[list[int], list[bool]]:
    """Repeat the i-th image placeholder counts[i] times (mask False there)."""
    n_images = sum(1 for t in ids if t == image_id)
    if n_images != len(counts):
        raise EncodeError(f"{n_images} image placeholders in the text but {len(counts)} images")
    out_ids: list[int] = []
    out_mask: list[bool] = []
    k = 0
    for t, m in zip(ids, mask):
        if t == image_id:
            out_ids += [image_id] * counts[k]
            out_mask += [False] * counts[k]
            k += 1
        else:
            out_ids.append(t)
            out_mask.append(m)
    return out_ids, out_mask


def align_to_expanded(ids: Sequence[int], mask: Sequence[bool], expanded: Sequence[int],
                      image_id: int) -> list[bool]:
    """The mask of `ids` (one placeholder per image) carried onto `expanded` (the same text with
    each placeholder repeated, as a processor returns it)."""
    out: list[bool] = []
    j = 0
    for t, m in zip(ids, mask):
        if t == image_id:
            start = j
            while j < len(expanded) and expanded[j] == image_id:
                j += 1
            if j == start:
                raise EncodeError(f"processor output has no image tokens at position {start}")
            out += [False] * (j - start)
        else:
            if j >= len(expanded) or expanded[j] != t:
                raise EncodeError(f"processor ids differ from the chat template's at position {j}")
            out.append(m)
            j += 1
    if j != len(expanded):
        raise EncodeError(f"processor output has {len(expanded) - j} extra tokens")
    return out


def assistant_spans(mask: Sequence[bool]) -> list[tuple[int, int]]:
    """The maximal runs of True in a loss mask, as [start, end) in order: one per assistant turn."""
    spans, start = [], None
    for t, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            spans.append((start, t))
            start = None
    return spans


def splice_answer(ids: Sequence[int], mask: Sequence[bool], span: tuple[int, int], answer: Sequence[int],
                  stop_ids: Sequence[int]) -> tuple[list[int], list[bool], bool]:
    """Replace the assistant span [start, end) by a generated answer cut after its first stop
    token -> (ids, mask, truncated). An answer without a stop token (cut by max_new_tokens) is
    closed with the span's own last token if that is a stop token (the template's end of turn,
    so later turns stay well-formed), unsupervised: the target did not produce it."""
    start, end = span
    cut = next((k + 1 for k, t in enumerate(answer) if t in stop_ids), None)
    if cut is not None:
        new, new_mask = list(answer[:cut]), [True] * cut
    else:
        closer = [ids[end - 1]] if ids[end - 1] in stop_ids else []
        new, new_mask = list(answer) + closer, [True] * len(answer) + [False] * len(closer)
    return list(ids[:start]) + new + list(ids[end:]), list(mask[:start]) + new_mask + list(mask[end:]), cut is None


class ImageInputs(NamedTuple):
    """A target's image inputs for some images, built on CPU without the model."""

    arrays: dict[str, np.ndarray]  # model kwargs batched on axis 0: pixel_values, image_sizes | image_grid_thw
    counts: list[int]              # placeholder tokens per image (= its projected visual tokens)


class ImageEncoder(Protocol):
    """What the CPU stage needs from a target directory (chosen by `spec_core.targets.load_image_encoder`)."""

    tokenizer: PreTrainedTokenizerBase
    image_token_id: int
    image_text: str  # the text of one image in a turn (replaces the manifest's MANIFEST_IMAGE)

    def __call__(self, images: list) -> ImageInputs: ...

    def token_inputs(self, input_ids_BT: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-token model inputs derived from the ids that `generate` needs besides them."""


class ProcessorImageEncoder:
    """Targets whose saved HF processor loads without torchvision (LLaVA, LLaVA-NeXT with PIL
    image processors): its image processor makes the arrays and its own `replace_image_token`
    (what the processor's __call__ expands each image to) gives the counts."""

    def __init__(self, directory: str | Path, config: PreTrainedConfig):
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(directory, local_files_only=True)
        self.tokenizer = self.processor.tokenizer
        self.image_token_id, self.image_text = config.image_token_id, self.processor.image_token
        if self.tokenizer.convert_tokens_to_ids(self.image_text) != self.image_token_id:
            raise ValueError(f"{directory}: the processor's image token {self.image_text!r} is not the "
                             f"model's image_token_id {self.image_token_id}")

    def __call__(self, images: list) -> ImageInputs:
        arrays = dict(self.processor.image_processor(images, return_tensors="np"))
        unused = set(getattr(self.processor, "unused_input_names", ()))
        counts = [self.processor.replace_image_token(arrays, i).count(self.image_text) for i in range(len(images))]
        return ImageInputs({k: v for k, v in arrays.items() if k not in unused}, counts)

    def token_inputs(self, input_ids_BT: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}


def collate_image_inputs(per_sample: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Samples' image arrays concatenated on the image axis. Trailing axes are zero-padded to
    the largest: LLaVA-NeXT's pixel_values (images, views, C, H, W) have a view count per image,
    and the model reads only the views its image_sizes imply (the processor pads a batch so)."""
    out = {}
    for key in per_sample[0]:
        arrays = [np.asarray(s[key]) for s in per_sample]
        shape = np.max([a.shape[1:] for a in arrays], axis=0) if arrays[0].ndim > 1 else ()
        padded = [np.pad(a, [(0, 0)] + [(0, int(m) - n) for m, n in zip(shape, a.shape[1:])]) for a in arrays]
        out[key] = torch.from_numpy(np.concatenate(padded))
    return out
