import hashlib
import io
import json

import pytest
from PIL import Image

from jobs._build_manifests.sources import (ImageSpec, MessagesConversation, PromptsConversation,
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


def test_qa_answer_index_formats():
    """An integer answer is an index into the choices (ScienceQA's `answer: 2`); letters follow the
    prompt's lettering, for a list and for a {letter: text} mapping; other answers are kept."""
    rec = {"q": "Which?", "opts": ["cat", "dog", "owl"], "a": 2}
    answer = lambda fmt, r=rec: QAConversation(kind="qa", question="q", answer="a", choices="opts",
                                               answer_format=fmt).turns(r)[1]["content"]
    assert (answer("letter"), answer("text"), answer("raw")) == ("C", "owl", "2")
    assert QAConversation(kind="qa", question="q", answer="a", choices="opts").answer_format == "letter"
    keyed = {"q": "Which?", "opts": {"P": "cat", "Q": "dog"}, "a": 1}
    assert (answer("letter", keyed), answer("text", keyed)) == ("Q", "dog")
    assert answer("letter", {**rec, "a": "B"}) == "B" and answer("text", {**rec, "a": True}) == "True"
    assert QAConversation(kind="qa", answer="a").turns({"question": "How many?", "a": 2})[1]["content"] == "2"
    with pytest.raises(ValueError, match="answer_format 'text' maps an answer index into the choices"):
        QAConversation(kind="qa", answer="a", answer_format="text")


def test_qa_answer_index_out_of_range_is_a_reason():
    conv = QAConversation(kind="qa", question="q", answer="a", choices="opts")
    assert conv.turns({"q": "Which?", "opts": ["cat", "dog"], "a": 2}) == (
        "bad answer: index 2 in 'a' is out of range of the 2 choices in 'opts'")
    assert conv.turns({"q": "Which?", "opts": ["cat"], "a": -1}).startswith("bad answer: index -1")
    assert conv.turns({"q": "Which?", "a": 0}) == "bad answer: index 0 in 'a' is out of range of the 0 choices in 'opts'"
    assert conv.turns({"q": "Which?", "opts": list(range(27)), "a": 0}).startswith("bad conversation: 27 choices")


def test_qa_context_line_as_scienceqa_prompts_it():
    """lmms-eval / LLaVA: "Context: <hint>\n" before the question, left out when the hint is empty."""
    conv = QAConversation(kind="qa", question="q", context="hint", choices="opts", answer="a",
                          suffix="Answer with the option's letter from the given choices directly.")
    rec = {"q": "Which is a mammal?", "opts": ["frog", "whale"], "a": 1, "hint": "Look closely."}
    assert conv.turns(rec) == [
        {"role": "user", "content": "Context: Look closely.\nWhich is a mammal?\nA. frog\nB. whale\n"
                                    "Answer with the option's letter from the given choices directly."},
        {"role": "assistant", "content": "B"}]
    for empty in ("", "  ", None):
        assert conv.turns({**rec, "hint": empty})[0]["content"].startswith("Which is a mammal?\n")
    assert conv.turns({**rec, "hint": 3}) == "bad conversation: 'hint' holds something other than text"
    assert conv.fields() == {"q", "hint", "opts", "a"}


def scienceqa_features(datasets):
    """The Hub's ScienceQA columns (derived/ScienceQA, lmms-lab/ScienceQA) that a manifest maps."""
    return datasets.Features({"image": datasets.Image(), "question": datasets.Value("string"),
                              "choices": datasets.List(datasets.Value("string")),
                              "answer": datasets.Value("int8"), "hint": datasets.Value("string")})


def test_hf_disk_dataset_and_datasetdict_folders(tmp_path):
    """Read by `datasets.load_from_disk`: a Dataset folder, a DatasetDict folder's split by name,
    the Image column kept as {bytes, path} structs (also an image-less row), only mapped columns."""
    datasets = pytest.importorskip("datasets")
    rows = {"image": [{"bytes": png((1, 2, 3)), "path": None}, None], "question": ["Q1", "Q2"],
            "choices": [["a", "b"], ["c", "d", "e"]], "answer": [1, 2], "hint": ["h", ""]}
    train = datasets.Dataset.from_dict(rows, features=scienceqa_features(datasets))
    train.save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": train, "test": train.select([1])}).save_to_disk(str(tmp_path / "dd"))
    store, cols = Storage(), {"image", "question", "answer"}
    recs = read_file("hf_disk", str(tmp_path / "ds"), store, cols)
    assert recs == read_file("hf_disk", str(tmp_path / "dd"), store, cols, split="train")
    assert [set(r) for r in recs] == [cols, cols] and recs[1] == {"image": None, "question": "Q2", "answer": 2}
    assert read_image(recs[0]["image"], ImageSpec(), store) == (
        None, png((1, 2, 3)), hashlib.sha256(png((1, 2, 3))).hexdigest())
    assert read_file("hf_disk", str(tmp_path / "dd"), store, cols, split="test") == recs[1:]
    assert read_file("hf_disk", str(tmp_path / "ds"), store, {"nothing"}) == [{}, {}]  # rows kept
    with pytest.raises(ValueError, match=r"holds a DatasetDict \(splits train, test\): point 'uri' at one"):
        read_file("hf_disk", str(tmp_path / "dd"), store, cols)
    with pytest.raises(ValueError, match="holds a DatasetDict without a split 'validation' .it has train, test."):
        read_file("hf_disk", str(tmp_path / "dd"), store, cols, split="validation")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="is not a folder written by datasets' save_to_disk"):
        read_file("hf_disk", str(tmp_path / "plain"), store, cols)


def test_expand_uris_globs_sorted_and_missing(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("")
    assert expand_uris(Storage(), str(tmp_path / "*.jsonl")) == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    with pytest.raises(ValueError, match="no file matches"):
        expand_uris(Storage(), [str(tmp_path / "c.txt"), str(tmp_path / "nope-*.jsonl")])
