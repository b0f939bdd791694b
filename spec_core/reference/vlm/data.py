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


def sentence_runs(ids: list[int], run: list[int], stop_id: int) -> list[list[int]]:
    """One turn's answer positions (`answer_runs`) split into sentences: a sentence ends at the
    position predicting `stop_id` (the full stop); what predicts the turn's end stands alone."""
    out: list[list[int]] = [[]]
    for q in run:
        out[-1].append(q)
        if ids[q + 1] == stop_id:
            out.append([])
    return [s for s in out if s]


def _segments(ids: list[int], labels: list[int], per_turn: list, stop_id: int | None, what: str) -> list[tuple]:
    """(answer positions, entry) per turn, where a list entry is split over the answer's
    sentences (`sentence_runs` at `stop_id`: one entry per sentence, what predicts the turn's end
    may stand alone)."""
    runs = answer_runs(labels)
    if len(runs) != len(per_turn):
        raise ValueError(f"{len(runs)} assistant turns but {what} for {len(per_turn)}")
    out: list[tuple] = []
    for run, entry in zip(runs, per_turn):
        if not isinstance(entry, list):
            out.append((run, entry))
            continue
        if stop_id is None:
            raise ValueError(f"per-sentence {what} need the full stop's token id (stop_id)")
        sentences = sentence_runs(ids, run, stop_id)
        if len(sentences) not in (len(entry), len(entry) + 1):  # + what predicts the turn's end
            raise ValueError(f"an answer of {len(sentences)} sentences but {what} for {len(entry)}")
        out += list(zip(sentences, entry))
    return out


def focus_pairs(ids: list[int], labels: list[int], image_id: int,
                keys_per_turn: list[np.ndarray | list[np.ndarray]], stop_id: int | None = None,
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(query positions, key positions) per turn that has keys: the positions predicting the
    turn's answer, and the image tokens it reads (`keys_per_turn`: indices among the image's
    placeholders, one entry per assistant turn). An entry may be a list, one array per sentence
    of the answer (`sentence_runs` at `stop_id`; a caption reads one panel per sentence)."""
    start = ids.index(image_id)
    return [(np.array(q), start + k) for q, k in _segments(ids, labels, keys_per_turn, stop_id, "regions") if len(k)]


def token_words(tok: PreTrainedTokenizerFast, ids: list[int]) -> list[str]:
    """Per position, the whole word its token is part of (BPE pieces of one word joined: a
    Metaspace token that starts with the word marker opens a word; punctuation stands alone)."""
    pieces = tok.convert_ids_to_tokens(ids)
    starts = [i for i, t in enumerate(pieces) if i == 0 or t.startswith("\u2581") or not t[:1].isalnum()
              or not pieces[i - 1][-1:].isalnum()]
    out: list[str] = []
    for a, b in zip(starts, starts[1:] + [len(pieces)]):
        out += ["".join(pieces[a:b]).lstrip("\u2581")] * (b - a)
    return out


def read_pairs(ids: list[int], labels: list[int], image_id: int, words: list[str],
               reads_per_turn: list[dict[str, np.ndarray] | list[dict[str, np.ndarray]]],
               stop_id: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(query position, key positions) per answer token of a word the image shows where the turn
    reads (`reads_per_turn`: per assistant turn, word -> indices among the image's placeholders,
    or a list of them per sentence as in `focus_pairs`; `words`: `token_words` of ids): the
    position predicting it, and the patches that show it."""
    start = ids.index(image_id)
    return [(np.array([q]), start + r[words[q + 1]]) for seg, r in _segments(ids, labels, reads_per_turn, stop_id, "reads")
            for q in seg if words[q + 1] in r and len(r[words[q + 1]])]


def sharpen(focus: list[tuple[np.ndarray, np.ndarray]], reads: list[tuple[np.ndarray, np.ndarray]],
            ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Focus pairs where the positions that read a word (`read_pairs`) attend to its patches
    instead of the whole region."""
    taken = np.array([int(q[0]) for q, _ in reads], dtype=np.int64)
    kept = [(q[~np.isin(q, taken)], k) for q, k in focus]
    return [(q, k) for q, k in kept if len(q)] + reads


def content_token_ids(tok: PreTrainedTokenizerFast, words: frozenset[str]) -> frozenset[int]:
    """Ids of the tokens that read as one of `words` (spaces and case aside)."""
    return frozenset(i for i in range(len(tok)) if tok.decode([i]).strip().lower() in words)


def turn_questions(labels: list[int]) -> list[tuple[list[int], range]]:
    """Per assistant turn, its answer positions (`answer_runs`) and its question's positions:
    what lies between turn t-1's answer and turn t's."""
    out, begin = [], 0
    for run in answer_runs(labels):
        out.append((run, range(begin, run[0] + 1)))
        begin = run[-1] + 2
    return out


def copy_pairs(ids: list[int], labels: list[int], content_ids: frozenset[int],
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(query position, key positions) per answer token that repeats a content token of its own
    turn's question ("... the colour of the cross?" -> "The cross ..."): the position predicting
    it, and where the question holds that token (the question of turn t: what lies between turn
    t-1's answer and turn t's)."""
    out = []
    for run, question in turn_questions(labels):
        for q in run:
            token = ids[q + 1]
            if token in content_ids:
                keys = [i for i in question if ids[i] == token]
                if keys:
                    out.append((np.array([q]), np.array(keys)))
    return out


def pair_mask(pairs: list[list[tuple[np.ndarray, np.ndarray]]], width: int) -> torch.Tensor:
    """(B, T, T) bool: row b holds True at (query, key) of each of its (queries, keys) pairs."""
    mask_BTT = torch.zeros((len(pairs), width, width), dtype=torch.bool)
    for b, row in enumerate(pairs):
        for q, k in row:
            mask_BTT[b, torch.from_numpy(q)[:, None], torch.from_numpy(k)[None, :]] = True
    return mask_BTT


@dataclass
class TaskPool:
    """Pre-encoded training examples, batched by task so that padding stays small; the image side
    is held once per distinct image (the hires world asks six questions of each). With `focus`,
    each example also lists, per answer, the image tokens it should read (the hires world's
    region panels) and batches carry them as `focus_BTT` (query position x key position); with
    `copy_words`, each answer token that repeats one of those words from its question reads
    where the question holds it (`copy_pairs`), as `copy_BTT`; with `reads` too, the positions
    predicting a word read from the image (`read_pairs`' queries), as `read_BT`."""

    images: dict[str, torch.Tensor]       # pixel_values (N, C, H, W) or (N, V, C, H, W) [+ image_sizes (N, 2)]
    examples: dict[str, list[tuple[int, list[int], list[int]]]]  # task -> (image row, ids, labels)
    pad_id: int
    focus: dict[str, list[list[tuple[np.ndarray, np.ndarray]]]] | None = None  # task -> per example
    copy: dict[str, list[list[tuple[np.ndarray, np.ndarray]]]] | None = None   # task -> per example
    read: dict[str, list[list[int]]] | None = None  # task -> per example, the positions predicting a read word

    @classmethod
    def build(cls, samples: list[dict], processor, n_image_tokens: int,
              focus: Callable[[dict], list[np.ndarray | list[np.ndarray]]] | None = None,
              copy_words: frozenset[str] | None = None,
              reads: Callable[[dict], list[dict[str, np.ndarray] | list[dict[str, np.ndarray]]]] | None = None,
              read_words: frozenset[str] | None = None) -> TaskPool:
        """`focus(sample)`: per assistant turn, the indices of the image tokens its answer reads
        (or a list of them, one per sentence: `focus_pairs`); `reads(sample)`: per turn, word ->
        the image tokens that show it, where the focus narrows to them (`read_pairs`, `sharpen`);
        `read_words`: only positions predicting one of these words are read positions (`read`,
        the read loss's), the focus narrows for every read word (None: every read word);
        `copy_words`: the words whose repetitions from the question are taught (`copy_pairs`)."""
        rows: dict[str, int] = {}
        pngs = []
        for s in samples:
            if s["image_sha256"] not in rows:
                rows[s["image_sha256"]] = len(pngs)
                pngs.append(s["image_png"])
        images = image_inputs(processor, [decode_png(b) for b in pngs])
        ex: dict[str, list] = {}
        foc: dict[str, list] = {}
        cop: dict[str, list] = {}
        rd: dict[str, list] = {}
        image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
        content = content_token_ids(processor.tokenizer, copy_words) if copy_words else frozenset()
        stop_id = processor.tokenizer.convert_tokens_to_ids(".")  # the full stop, for per-sentence focus
        for s in samples:
            ids, labels = encode_conversation(processor.tokenizer, list(s["conversation"]), n_image_tokens)
            ex.setdefault(s["task"], []).append((rows[s["image_sha256"]], ids, labels))
            shown = reads(s) if focus is not None and reads is not None else None  # per turn, what the image shows
            words = token_words(processor.tokenizer, ids) if shown is not None else None
            if focus is not None:
                pairs = focus_pairs(ids, labels, image_id, focus(s), stop_id)
                if shown is not None:
                    rp = read_pairs(ids, labels, image_id, words, shown, stop_id)
                    pairs = sharpen(pairs, rp)
                    queries = [int(q[0]) for q, _ in rp]
                    rd.setdefault(s["task"], []).append(
                        [q for q in queries if read_words is None or words[q + 1] in read_words])
                foc.setdefault(s["task"], []).append(pairs)
            if copy_words:
                cop.setdefault(s["task"], []).append(copy_pairs(ids, labels, content))
        return cls(images, ex, processor.tokenizer.pad_token_id, foc if focus is not None else None,
                   cop if copy_words else None, rd if focus is not None and reads is not None else None)

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
            out["focus_BTT"] = pair_mask([self.focus[task][j] for j in js], width)
        if self.copy is not None:
            out["copy_BTT"] = pair_mask([self.copy[task][j] for j in js], width)
        if self.read is not None:
            read_BT = torch.zeros((size, width), dtype=torch.bool)
            for b, j in enumerate(js):
                read_BT[b, self.read[task][j]] = True
            out["read_BT"] = read_BT
        return out
