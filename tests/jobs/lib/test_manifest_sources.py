import hashlib
import io
import json

import pytest
from PIL import Image

from jobs.lib.manifest_sources import (ImageSpec, MessagesConversation, PromptsConversation,
                                       QAConversation, expand_uris, read_file, read_image,
                                       with_image_token)
from jobs.lib.storage import Storage


def png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


def test_llava_json_mapping(tmp_path):
    """The LLaVA-v1.5-Mix-665K layout: [{id, image (relative), conversations [{from, value}]}]."""
    (tmp_path / "images" / "coco").mkdir(parents=True)
    (tmp_path / "images" / "coco" / "1.png").write_bytes(png((255, 0, 0)))
    items = [{"id": "000000000001", "image": "coco/1.png", "model": "", "conversations": [
        {"from": "human", "value": "What colour is it?\n<image>"}, {"from": "gpt", "value": "Red."},
        {"from": "human", "value": "Sure?"}, {"from": "gpt", "value": "Yes."}]}]
    (tmp_path / "mix.json").write_text(json.dumps(items))
    conv = MessagesConversation(kind="messages", field="conversations", role_key="from", content_key="value")
    spec, store = ImageSpec(field="image", root=str(tmp_path / "images")), Storage()
    recs = read_file("json", str(tmp_path / "mix.json"), store, {"id", "image", "conversations"})
    assert set(recs[0]) == {"id", "image", "conversations"}  # only the mapped columns are kept
    turns = with_image_token(conv.turns(recs[0]))
    assert turns == [{"role": "user", "content": "<image>\nWhat colour is it?"},
                     {"role": "assistant", "content": "Red."},
                     {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "Yes."}]
    uri, data, sha = read_image(recs[0]["image"], spec, store)
    assert uri == str(tmp_path / "images" / "coco" / "1.png") and data is None
    assert sha == hashlib.sha256(png((255, 0, 0))).hexdigest()


def test_mmspec_jsonl_mapping_and_bad_lines(tmp_path):
    lines = [json.dumps({"id": "q1", "image": "a.png", "turns": ["Describe.", "And the sky?"],
                         "category": "captioning"}), "", "{not json", json.dumps([1, 2])]
    (tmp_path / "mmspec.jsonl").write_text("\n".join(lines) + "\n")
    recs = read_file("jsonl", str(tmp_path / "mmspec.jsonl"), Storage(), {"id", "image", "turns", "category"})
    assert len(recs) == 3  # the blank line is no record
    assert with_image_token(PromptsConversation(kind="prompts").turns(recs[0])) == [
        {"role": "user", "content": "<image>\nDescribe."}, {"role": "user", "content": "And the sky?"}]
    assert recs[1]["__manifest_error__"].startswith("invalid record: line 3 is not JSON")
    assert recs[2]["__manifest_error__"] == "invalid record: item 4 is not a JSON object"


def test_qa_mapping_with_choices():
    conv = QAConversation(kind="qa", question="q", answer="a", choices="opts", suffix="Answer with the letter.")
    assert conv.turns({"q": "Which?", "opts": ["cat", "dog"], "a": ["B", "b"]}) == [
        {"role": "user", "content": "Which?\nA. cat\nB. dog\nAnswer with the letter."},
        {"role": "assistant", "content": "B"}]
    assert conv.turns({"q": "Which?", "opts": {"X": "cat"}})[0]["content"].splitlines()[1] == "X. cat"
    assert conv.turns({"q": ""}).startswith("empty conversation")


def test_conversation_failures_are_reasons():
    conv = MessagesConversation(kind="messages")
    assert conv.turns({"conversations": []}).startswith("empty conversation")
    assert conv.turns({"conversations": [{"role": "system", "content": "x"}]}).startswith("bad conversation")
    assert conv.turns({"conversations": [{"role": "user", "content": None}]}).startswith("bad conversation")
    assert with_image_token([{"role": "assistant", "content": "hi"}]).startswith("bad conversation")
    assert PromptsConversation(kind="prompts").turns({"turns": [1]}).startswith("bad conversation")


def test_image_failures_are_reasons(tmp_path):
    spec, store = ImageSpec(field="image", root=str(tmp_path)), Storage()
    (tmp_path / "bad.png").write_bytes(b"\x89PNG but not really")
    assert read_image("missing.png", spec, store) == f"image not found: {tmp_path / 'missing.png'}"
    assert read_image("bad.png", spec, store).startswith(f"image unreadable: {tmp_path / 'bad.png'}")
    assert read_image(None, spec, store) == "no image: nothing usable in 'image'"
    assert read_image({"bytes": None, "path": None}, spec, store).startswith("no image")
    ok = read_image({"bytes": png((0, 0, 9)), "path": "x.png"}, spec, store)  # an HF Image struct
    assert ok == (None, png((0, 0, 9)), hashlib.sha256(png((0, 0, 9))).hexdigest())


def test_hf_disk_as_written_by_datasets(tmp_path):
    """A `datasets` DatasetDict saved to disk; each split folder is one hf_disk source file."""
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                               "question": datasets.Value("string")})
    rows = {"id": ["a", "b"], "image": [{"bytes": png((1, 2, 3)), "path": None}] * 2, "question": ["Q1", "Q2"]}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=feats)})
    dd.save_to_disk(str(tmp_path / "dd"))
    recs = read_file("hf_disk", str(tmp_path / "dd" / "train"), Storage(), {"id", "image", "question"})
    assert [r["id"] for r in recs] == ["a", "b"] and recs[1]["question"] == "Q2"
    assert read_image(recs[0]["image"], ImageSpec(), Storage())[1] == png((1, 2, 3))


def test_expand_uris_globs_sorted_and_missing(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("")
    assert expand_uris(Storage(), str(tmp_path / "*.jsonl")) == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    with pytest.raises(ValueError, match="no file matches"):
        expand_uris(Storage(), [str(tmp_path / "c.txt"), str(tmp_path / "nope-*.jsonl")])
