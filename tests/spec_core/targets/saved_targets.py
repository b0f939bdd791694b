"""The tiny random LLaVA-1.5, LLaVA-NeXT and Qwen2.5-VL of conftest.py saved as local model
directories that jobs can load: a word-level tokenizer whose ids match the models' (pad 0, bos 1,
eos 2, image 99, Qwen's vision start / end 97 / 96), a chat template, and the image side - the
LLaVA processors over their PIL-backed image processors, Qwen2.5-VL's PIL-backed image processor
alone (its processor needs torchvision). Every word is one token, so a test can spell expected token ids directly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import CLIPImageProcessorPil, LlavaNextProcessor, LlavaProcessor, PreTrainedTokenizerFast
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from spec_core.reference.vlm.tokenizer import CHAT_TEMPLATE
from tests.spec_core.targets.conftest import BOS, IMAGE, PAD, build_llava, build_llava_next, build_qwen

EOS, UNK, USER, ASSISTANT, END, IM_START, IM_END = 2, 3, 4, 5, 6, 7, 8
VISION_END, VISION_START, VIDEO = 96, 97, 98
WORDS = ["red", "green", "blue", "yellow", "circle", "square", "triangle", "star", "small", "large",
         "what", "is", "the", "a", "colour", "shape", "size", "of", "and", "it", "left", "right", "?",
         "user", "assistant", "system"]
# ChatML without {% generation %} tags: the loss mask comes from encode's prefix method
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def word_ids(text: str) -> list[int]:
    """Token ids of plain words (no special tokens) under word_tokenizer."""
    return [10 + WORDS.index(w) for w in text.split()]


def word_tokenizer(image_token: str, chat_template: str) -> PreTrainedTokenizerFast:
    """One token per word or special token, ids fixed to the tiny models' config ids."""
    specials = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", UNK: "<unk>", USER: "<|user|>", ASSISTANT: "<|assistant|>",
                END: "<|end|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>", VISION_END: "<|vision_end|>",
                VISION_START: "<|vision_start|>", VIDEO: "<|video_pad|>", IMAGE: image_token}
    vocab = {tok: i for i, tok in specials.items()} | {w: 10 + i for i, w in enumerate(WORDS)}
    assert max(vocab.values()) < 100 and len(set(vocab.values())) == len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins tokens with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials.values()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", extra_special_tokens={"image_token": image_token})
    fast.chat_template = chat_template
    return fast


def _save_llava_family(directory: Path, model, processor_class, images) -> Path:
    """A LLaVA(-NeXT) model with its processor over `images` (16 px views of 8 px patches)."""
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = [END, EOS], PAD  # stop at end of turn
    processor = processor_class(image_processor=images, tokenizer=word_tokenizer("<image>", CHAT_TEMPLATE),
                                patch_size=8, vision_feature_select_strategy="default",
                                num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def save_llava(directory: Path) -> Path:
    """Tiny LLaVA-1.5 + LlavaProcessor: every image resized and cropped to 16 px, 4 visual tokens."""
    images = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    return _save_llava_family(directory, build_llava(), LlavaProcessor, images)


def save_llava_next(directory: Path) -> Path:
    """Tiny LLaVA-NeXT + LlavaNextProcessor (grid pinpoints 16x32, 32x16, 32x32 over 16 px views):
    a 32x16 (w x h) image gives 14 visual tokens, 20x20 gives 24."""
    model = build_llava_next()
    images = LlavaNextImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                        image_grid_pinpoints=model.config.image_grid_pinpoints)
    return _save_llava_family(directory, model, LlavaNextProcessor, images)


def save_qwen(directory: Path) -> Path:
    """Tiny Qwen2.5-VL + tokenizer + image processor (patch 4, merge 2: a 40x24 image is a 6x10
    patch grid, 15 visual tokens; 32x16 is 4x8, 8 tokens)."""
    model = build_qwen()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = [IM_END, EOS], PAD
    vision = model.config.vision_config
    images = Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                      temporal_patch_size=vision.temporal_patch_size,
                                      size={"shortest_edge": 64, "longest_edge": 64 * 64})  # in pixels
    model.save_pretrained(directory)
    word_tokenizer("<|image_pad|>", CHATML).save_pretrained(directory)
    images.save_pretrained(directory)
    return directory


def png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def conversation(rng: np.random.Generator, turns: int) -> list[dict]:
    """Random words; the first user turn opens with the manifest's image marker."""
    words = lambda n: " ".join(rng.choice(WORDS[:22], n))  # noqa: E731 - no role words in content
    conv = []
    for t in range(turns):
        conv.append({"role": "user", "content": ("<image>\n" if t == 0 else "") + words(4) + " ?"})
        conv.append({"role": "assistant", "content": words(int(rng.integers(3, 7)))})
    return conv
