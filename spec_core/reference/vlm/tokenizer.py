"""The reference VLM's tokenizer: BPE trained offline on the synthetic corpus, saved as a
Hugging Face fast tokenizer with special tokens and a chat template whose assistant spans are
marked ({% generation %}), so `apply_chat_template(..., return_assistant_tokens_mask=True)` works."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
IMAGE = "<image>"
USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
SPECIALS = [PAD, BOS, EOS, UNK, IMAGE, USER, ASSISTANT, END]

# One turn: "<|role|>\n{content}<|end|>\n"; the assistant's content and its <|end|> are the
# generation span (what the model learns to produce and what `generate` stops on).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|>\n{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """BPE over whitespace-marked words (Metaspace, like SentencePiece), digits kept whole."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=1,
                                  show_progress=False, initial_alphabet=list("\n"))
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE},
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"  # batched generation pads on the left
    return fast


def stop_token_ids(tok: PreTrainedTokenizerFast) -> list[int]:
    """Ids that end an assistant turn (`<|end|>`, `</s>`)."""
    return [tok.convert_tokens_to_ids(END), tok.eos_token_id]
