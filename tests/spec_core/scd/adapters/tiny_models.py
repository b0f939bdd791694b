"""Tiny random Janus, Emu3 and Chameleon image generators (~0.1-0.5 M parameters each), built
from configs in code with small hand-made vocabularies, seeded, in eval mode without grads.

The vocabulary maps mimic the real ones where the adapters read them: Emu3's visual tokens are
named `<|visual token000123|>` and its structure tokens `<|extra_200|>` (end of line) etc.;
Chameleon's image tokens are `IMGIMG` + the code's decimal digits written as letters A-J + `Z`.
"""

from __future__ import annotations

import torch
from transformers import (ChameleonConfig, ChameleonForConditionalGeneration, Emu3Config,
                          Emu3ForConditionalGeneration, JanusConfig, JanusForConditionalGeneration,
                          LlamaConfig)

TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def _frozen(model, layers):
    """Eval mode, no grads; q/k weights large enough that attention is far from uniform (at HF's
    init std 0.02 every position attends almost uniformly and greedy paths are degenerate)."""
    with torch.no_grad():
        for layer in layers:
            layer.self_attn.q_proj.weight.normal_(0.0, 0.5)
            layer.self_attn.k_proj.weight.normal_(0.0, 0.5)
    return model.eval().requires_grad_(False)


# --- Janus: text vocabulary 64, image codebook 48, a 4 x 4 token image decoded to 8 x 8 pixels ---
J_PAD, J_BOS, J_EOS, J_BOI, J_EOI, J_IMAGE = 0, 1, 2, 60, 61, 62
J_CODES, J_GRID = 48, 4


def build_janus() -> JanusForConditionalGeneration:
    torch.manual_seed(0)
    text = LlamaConfig(vocab_size=64, pad_token_id=J_PAD, bos_token_id=J_BOS, eos_token_id=J_EOS, **TEXT)
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4,
                  projection_dim=32, num_image_tokens=J_GRID * J_GRID, depth=1)
    vq = dict(embed_dim=8, num_embeddings=J_CODES, latent_channels=32, base_channels=32,
              channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=32, image_token_embed_dim=32,
              num_hidden_layers=2)
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=J_IMAGE)
    model = JanusForConditionalGeneration(config)
    # what the released checkpoints' generation_config.json holds and JanusForConditionalGeneration
    # .generate(generation_mode="image") reads
    model.generation_config.bos_token_id = J_BOS
    model.generation_config.pad_token_id = J_PAD
    model.generation_config.generation_kwargs = {"boi_token_id": J_BOI}
    return _frozen(model, model.model.language_model.layers)


# --- Emu3: 16 text tokens, 12 specials, 32 visual tokens ---------------------------------------
E_CODES = 32
E_SPECIALS = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|extra_200|>", "<|extra_201|>",
              "<|image start|>", "<|image end|>", "<|image token|>", "<image>"]


def emu3_vocabulary() -> dict[str, int]:
    names = E_SPECIALS + list("0123456789*") + ["a", "b", "c", "d", "e"]
    names += [f"<|visual token{i:06d}|>" for i in range(E_CODES)]
    return {name: i for i, name in enumerate(names)}


def build_emu3() -> Emu3ForConditionalGeneration:
    torch.manual_seed(1)
    vocab = emu3_vocabulary()
    text = dict(vocab_size=len(vocab), pad_token_id=vocab["<|endoftext|>"], bos_token_id=vocab["<|extra_203|>"],
                eos_token_id=vocab["<|extra_204|>"], attention_dropout=0.0, **TEXT)
    vq = dict(codebook_size=E_CODES, embed_dim=4, latent_channels=4, base_channels=32,
              channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
              num_attention_heads=1, temporal_downsample_factor=2)
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=vocab)
    model = Emu3ForConditionalGeneration(config)
    return _frozen(model, model.model.text_model.layers)


# --- Chameleon: 20 text/special tokens then 32 image tokens ------------------------------------
C_CODES = 32


def chameleon_vocabulary() -> dict[str, int]:
    letters = lambda i: "".join(chr(ord("A") + int(d)) for d in str(i))  # noqa: E731
    names = ["<pad>", "<s>", "</s>", "<reserved08706>", "<racm3:break>", "<eoss>", "<image>"]
    names += [f"w{i}" for i in range(13)]
    # the image block sits in the middle of the vocabulary, shuffled, as in the real map
    codes = torch.randperm(C_CODES, generator=torch.Generator().manual_seed(3)).tolist()
    names += [f"IMGIMG{letters(c)}Z" for c in codes] + ["w13", "w14"]
    return {name: i for i, name in enumerate(names)}


def build_chameleon() -> ChameleonForConditionalGeneration:
    torch.manual_seed(2)
    vocab = chameleon_vocabulary()
    vq = dict(embed_dim=8, num_embeddings=C_CODES, latent_channels=8, resolution=16, base_channels=32,
              channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[])
    config = ChameleonConfig(vocab_size=len(vocab), pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             vq_config=vq, vocabulary_map=vocab, **TEXT)
    model = ChameleonForConditionalGeneration(config)
    return _frozen(model, model.model.layers)
