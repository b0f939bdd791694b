"""Conversations -> target token ids with a loss mask on exactly the assistant tokens.

Two ways to find the assistant spans, so any chat template works:
- templates with `{% generation %}` blocks (the reference target's): HF's
  `return_assistant_tokens_mask`;
- any other template (LLaVA/Vicuna, Qwen ChatML, ...): render the conversation up to each
  assistant turn with `add_generation_prompt=True` and through that turn; the tokens the turn
  adds, up to its last special token (the end-of-turn token), are its span. A template whose shorter rendering is not a token prefix of the longer one
  cannot be masked this way: `EncodeError` (the caller rejects the sample with that reason).

Image placeholders stay one token each in the template; `expand_image_tokens` then repeats the
i-th one counts[i] times (one per projected visual token, as the HF processors do), carrying the
mask along, and `align_to_expanded` maps a mask onto ids a processor has already expanded.

Shapes: T tokens of one sample (lists, not tensors: this runs per sample in CPU workers).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase


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
