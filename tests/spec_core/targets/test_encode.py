"""Assistant masks: the template-agnostic prefix method agrees with HF's {% generation %} masks
(the oracle), placeholders expand like LlavaProcessor, bad conversations are refused."""

from contextlib import contextmanager

import pytest
from PIL import Image

from spec_core.reference.tasks import TASKS, corpus_texts, make_split
from spec_core.reference.vlm.data import IGNORE, encode_conversation
from spec_core.reference.vlm.model import PRESETS, build_processor
from spec_core.reference.vlm.tokenizer import CHAT_TEMPLATE, train_tokenizer
from spec_core.targets.encode import (EncodeError, align_to_expanded, check_conversation,
                                      encode_with_mask, expand_image_tokens)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def samples():
    return [s for t in TASKS for s in make_split(t, 3, 0, "train")]


@pytest.fixture(scope="module")
def tok(samples):
    tok = train_tokenizer([*corpus_texts(samples), "assistant user"], 400)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tok


@contextmanager
def template(tok, chat_template):
    saved, tok.chat_template = tok.chat_template, chat_template
    try:
        yield
    finally:
        tok.chat_template = saved


def _conv(sample):
    return [dict(t) for t in sample["conversation"]]


def test_generation_tags_match_the_reference_encoder(tok, samples):
    image_id = tok.convert_tokens_to_ids("<image>")
    for s in samples:
        ids, mask = encode_with_mask(tok, _conv(s))
        ids_x, mask_x = expand_image_tokens(ids, mask, image_id, [16])
        ref_ids, ref_labels = encode_conversation(tok, _conv(s), 16)
        assert ids_x == ref_ids
        assert mask_x == [lab != IGNORE for lab in ref_labels]


def test_prefix_method_equals_generation_masks(tok, samples):
    """The same template without {% generation %} tags: the prefix method finds the same spans."""
    untagged = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    for s in samples:
        ids_ref, mask_ref = encode_with_mask(tok, _conv(s))
        with template(tok, untagged):
            assert encode_with_mask(tok, _conv(s)) == (ids_ref, mask_ref)


def test_chatml_masks_cover_the_answers(tok, samples):
    with template(tok, CHATML):
        s = next(x for x in samples if x["task"] == "multi_turn")
        conv = _conv(s)
        ids, mask = encode_with_mask(tok, conv)
        spans, cur = [], []
        for t, m in zip(ids, mask):
            if m:
                cur.append(t)
            elif cur:
                spans.append(tok.decode(cur))
                cur = []
        spans += [tok.decode(cur)] if cur else []
        answers = [t["content"] for t in conv if t["role"] == "assistant"]
        assert len(spans) == len(answers)
        for span, answer in zip(spans, answers):
            assert span.replace(" ", "").startswith(answer.replace(" ", ""))
            assert span.endswith("<|im_end|>")


def test_template_that_rewrites_history_is_refused(tok, samples):
    # the last message renders differently from earlier ones: no stable prefix
    rewriting = "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}\n{% endfor %}"
    with template(tok, rewriting), pytest.raises(EncodeError, match="prefix-stable"):
        encode_with_mask(tok, _conv(samples[0]))


@pytest.mark.parametrize("conv, reason", [
    ([], "empty conversation"),
    ([{"role": "assistant", "content": "hi"}], "expected 'user'"),
    ([{"role": "user", "content": "hi"}], "does not end with an assistant"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}], "no text content"),
])
def test_bad_conversations(conv, reason):
    with pytest.raises(EncodeError, match=reason):
        check_conversation(conv)


def test_processor_expansion_aligns(tok, samples):
    size = PRESETS["small"]
    processor = build_processor(size, tok)
    image_id = tok.convert_tokens_to_ids("<image>")
    s = samples[0]
    ids, mask = encode_with_mask(tok, _conv(s))
    text = tok.apply_chat_template(_conv(s), tokenize=False)
    expanded = processor(text=text, images=Image.new("RGB", (64, 64)), add_special_tokens=False,
                         return_tensors="pt")["input_ids"][0].tolist()
    ids_x, mask_x = expand_image_tokens(ids, mask, image_id, [size.n_patches])
    assert expanded == ids_x
    assert align_to_expanded(ids, mask, expanded, image_id) == mask_x
    with pytest.raises(EncodeError, match="differ"):
        align_to_expanded(ids, mask, expanded[:5] + [expanded[5] + 1] + expanded[6:], image_id)
    with pytest.raises(EncodeError, match="2 images"):
        expand_image_tokens(ids, mask, image_id, [16, 16])


def test_answer_slots_make_prompts_only_conversations_alternate(tok):
    """MMSpec `turns` (consecutive user prompts, no answers) -> one stand-in answer per prompt, so
    the conversation encodes with one assistant span per prompt; alternating ones are unchanged."""
    from spec_core.targets.encode import assistant_spans, with_answer_slots

    users = [{"role": "user", "content": f"<image>\n{q}"} for q in ("What is it?", "Why?", "Where?")]
    conv = with_answer_slots(users)
    assert [t["role"] for t in conv] == ["user", "assistant"] * 3
    assert [t["content"] for t in conv[1::2]] == ["."] * 3 and conv[0::2] == users
    check_conversation(conv)
    _, mask = encode_with_mask(tok, conv)
    assert len(assistant_spans(mask)) == 3
    answered = [users[0], {"role": "assistant", "content": "A dog."}, users[1]]
    assert with_answer_slots(answered) == answered + [{"role": "assistant", "content": "."}]
    full = [{"role": "system", "content": "Be brief."}, *answered, {"role": "assistant", "content": "Fun."}]
    assert with_answer_slots(full) == full
    with pytest.raises(EncodeError, match="turn 1 has role 'user'"):  # what generate hit before
        check_conversation(users)
