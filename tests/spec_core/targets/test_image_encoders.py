"""Image encoders chosen by config class: LLaVA-NeXT's ids equal its full HF processor's (the
oracle); Qwen2.5-VL's placeholder counts equal the model's own visual token counts; batches of
samples with different view counts collate and prefill; answer splicing for self-distillation."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from spec_core.targets import load_image_encoder, load_target
from spec_core.targets.base import pad_left
from spec_core.targets.encode import (MANIFEST_IMAGE, ProcessorImageEncoder, assistant_spans, collate_image_inputs,
                                      encode_with_mask, expand_image_tokens, splice_answer)
from spec_core.targets.qwen2_5_vl import Qwen2_5_VLImageEncoder
from tests.spec_core.targets.conftest import IMAGE
from tests.spec_core.targets.saved_targets import (VISION_END, VISION_START, conversation, png, save_llava_next,
                                                    save_qwen)

SIZES = [(32, 16), (20, 20), (40, 24)]  # width x height


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("targets")
    return {"llava_next": save_llava_next(root / "llava_next"), "qwen": save_qwen(root / "qwen")}


def _image(w: int, h: int) -> Image.Image:
    return Image.open(io.BytesIO(png(w, h, w * h))).convert("RGB")


def _encode(encoder, conv, image):
    conv = [dict(t, content=t["content"].replace(MANIFEST_IMAGE, encoder.image_text)) for t in conv]
    ids, mask = encode_with_mask(encoder.tokenizer, conv)
    inputs = encoder([image])
    return (*expand_image_tokens(ids, mask, encoder.image_token_id, inputs.counts), inputs)


def test_encoder_is_chosen_by_config_class(dirs, tmp_path):
    assert type(load_image_encoder(dirs["llava_next"])) is ProcessorImageEncoder
    assert type(load_image_encoder(dirs["qwen"])) is Qwen2_5_VLImageEncoder
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="no image encoder"):
        load_image_encoder(tmp_path)


def test_llava_next_ids_equal_the_full_processor(dirs):
    encoder = load_image_encoder(dirs["llava_next"])
    rng = np.random.default_rng(0)
    counts = []
    for w, h in SIZES:
        conv, image = conversation(rng, 2), _image(w, h)
        ids, _, inputs = _encode(encoder, conv, image)
        text = encoder.tokenizer.apply_chat_template(conv, tokenize=False)
        full = encoder.processor(text=text, images=image, add_special_tokens=False, return_tensors="np")
        assert ids == full["input_ids"][0].tolist()
        assert all(np.array_equal(inputs.arrays[k], full[k]) for k in ("pixel_values", "image_sizes"))
        counts += inputs.counts
    assert counts == [14, 24, 14]


def test_qwen_counts_are_the_models_visual_tokens(dirs):
    encoder = load_image_encoder(dirs["qwen"])
    adapter = load_target(dirs["qwen"])
    rng = np.random.default_rng(1)
    rows = [_encode(encoder, conversation(rng, 1), _image(w, h)) for w, h in SIZES]
    for ids, _, inputs in rows:
        start = ids.index(VISION_START)
        assert ids[start + 1: start + 1 + inputs.counts[0]] == [IMAGE] * inputs.counts[0]
        assert ids[start + 1 + inputs.counts[0]] == VISION_END
    batch = collate_image_inputs([r[2].arrays for r in rows])
    with torch.no_grad():
        per_image = adapter.model.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output
    assert [len(f) for f in per_image] == [r[2].counts[0] for r in rows] == [8, 4, 15]
    ids_BT, mask_BT = pad_left([r[0] for r in rows], 0)
    assert torch.equal(encoder.token_inputs(ids_BT)["mm_token_type_ids"], (ids_BT == IMAGE).int())
    out = adapter.prefill({"input_ids": ids_BT, "attention_mask": mask_BT, **batch})
    assert out.visual_valid_BP.sum(-1).tolist() == [8, 4, 15]


def test_llava_next_views_are_padded_across_samples(dirs):
    encoder = load_image_encoder(dirs["llava_next"])
    adapter = load_target(dirs["llava_next"])
    rng = np.random.default_rng(2)
    rows = [_encode(encoder, conversation(rng, 1), _image(w, h)) for w, h in SIZES[:2]]  # 3 and 5 views
    batch = collate_image_inputs([r[2].arrays for r in rows])
    assert batch["pixel_values"].shape == (2, 5, 3, 16, 16) and (batch["pixel_values"][0, 3:] == 0).all()
    ids_BT, mask_BT = pad_left([r[0] for r in rows], 0)
    out = adapter.prefill({"input_ids": ids_BT, "attention_mask": mask_BT, **batch})
    single = adapter.prefill({"input_ids": torch.tensor([rows[0][0]]), **collate_image_inputs([rows[0][2].arrays])})
    assert torch.allclose(out.visual_BPD[0, :14], single.visual_BPD[0], atol=1e-5)


def test_splice_answer():
    ids = [1, 5, 30, 31, 6, 4, 7, 5, 32, 6, 9]
    mask = [False, False, True, True, True, False, False, False, True, True, False]
    assert assistant_spans(mask) == [(2, 5), (8, 10)]
    # stopped: kept through the first stop token, the rest of the sequence follows
    new_ids, new_mask, cut = splice_answer(ids, mask, (2, 5), [40, 41, 42, 2, 0, 0], stop_ids=[6, 2])
    assert (new_ids, cut) == ([1, 5, 40, 41, 42, 2, 4, 7, 5, 32, 6, 9], False)
    assert assistant_spans(new_mask) == [(2, 6), (9, 11)]
    # cut by max_new_tokens: closed with the span's end-of-turn token, unsupervised
    new_ids, new_mask, cut = splice_answer(ids, mask, (8, 10), [40, 41], stop_ids=[6, 2])
    assert (new_ids[8:], new_mask[8:], cut) == ([40, 41, 6, 9], [True, True, False, False], True)
