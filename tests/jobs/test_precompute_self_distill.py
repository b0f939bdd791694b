"""jobs/precompute.py with data.response_source=target: every stored assistant span is exactly what
the target's own greedy `generate` returns for the stored tokens before it (so later turns see the
target's earlier answers), the rest of each conversation is the dataset's, and the artifacts say
where the answers came from. On the tiny reference target (trained: it stops by itself) and on a
tiny random LLaVA-NeXT (answers vary with the input, and most are cut by max_new_tokens)."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration, LlavaNextForConditionalGeneration

from jobs.lib.artifact_store import read_kind
from jobs.lib.storage import Storage
from jobs.precompute import PrecomputeConfig, main
from spec_core.reference.tasks import TASKS, make_split
from spec_core.reference.vlm.build import build_target
from spec_core.reference.vlm.data import IGNORE, decode_png, encode_conversation
from spec_core.reference.vlm.model import pixels
from spec_core.targets.encode import assistant_spans
from tests.spec_core.targets.conftest import IMAGE
from tests.spec_core.targets.saved_targets import conversation, png, save_llava_next


def _run(root, rows: list[dict], target, max_new: int) -> dict:
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    cfg = PrecomputeConfig.model_validate({
        "run": {"output_uri": str(root / "out")}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(root / "train.parquet"), "shard_size": 4, "response_source": "target",
                 "response_max_new_tokens": max_new},
        "target": {"path": str(target)}, "compute": {"batch_size": 3}})
    m = main(cfg)
    art = m["figures"]["artifacts_uri"]
    return {"metrics": m, "rows": {r["id"]: r for r in rows}, "max_new": max_new,
            "table": read_kind(Storage(), art, "samples"),
            "index": json.loads(Storage().read_text(f"{art}/index.json"))}


@pytest.fixture(scope="module")
def reference(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    samples = [s for t in TASKS for s in make_split(t, 2, 0, "train")]
    build_target("tiny", str(root / "target"), samples=samples)
    rows = [{"id": s["id"], "source": s["task"], "split": "train", "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"],
             "conversation": s["conversation"]} for s in samples]
    model = LlavaForConditionalGeneration.from_pretrained(root / "target").eval()
    tokenizer = AutoProcessor.from_pretrained(root / "target").tokenizer

    def dataset_ids(row):  # the reference encoder: placeholders expanded, labels on the answers
        ids, labels = encode_conversation(tokenizer, list(row["conversation"]), model.config.image_seq_length)
        return ids, [lab != IGNORE for lab in labels]

    run = _run(root, rows, root / "target", max_new=4)
    return {**run, "model": model, "images": lambda row: {"pixel_values": pixels([decode_png(row["image_bytes"])])},
            "dataset_ids": dataset_ids, "suppress": []}


@pytest.fixture(scope="module")
def random_next(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("llava_next")
    target = save_llava_next(root / "target")
    rng = np.random.default_rng(3)
    rows = [{"id": f"s{i}", "source": "tiny", "split": "train", "task": "t", "image_uri": None,
             "image_bytes": png(*[(32, 16), (20, 20)][i % 2], seed=i), "image_sha256": f"img{i}",
             "conversation": conversation(rng, 2 + i % 2)} for i in range(6)]
    model = LlavaNextForConditionalGeneration.from_pretrained(target).eval()
    processor = AutoProcessor.from_pretrained(target)

    def images(row):
        image = Image.open(io.BytesIO(row["image_bytes"])).convert("RGB")
        return {k: torch.from_numpy(v) for k, v in processor.image_processor([image], return_tensors="np").items()}

    def dataset_ids(row):  # HF's processor expands the placeholders; HF's {% generation %} masks
        text = processor.tokenizer.apply_chat_template(row["conversation"], tokenize=False)
        image = Image.open(io.BytesIO(row["image_bytes"])).convert("RGB")
        ids = processor(text=text, images=image, add_special_tokens=False)["input_ids"][0]
        mask = processor.tokenizer.apply_chat_template(row["conversation"], return_dict=True,
                                                       return_assistant_tokens_mask=True)["assistant_masks"]
        at, extra = ids.index(IMAGE), ids.count(IMAGE) - 1  # the one placeholder, repeated in place
        return ids, [bool(m) for m in mask[:at]] + [False] * extra + [bool(m) for m in mask[at:]]

    # the random model may emit its image token: the job suppresses it (it could not be prefilled)
    run = _run(root, rows, target, max_new=6)
    return {**run, "model": model, "images": images, "dataset_ids": dataset_ids, "suppress": [IMAGE]}


def _segments(ids: list[int], mask: list[bool]) -> list[list[int]]:
    """The unmasked stretches around the assistant spans."""
    cuts = [0] + [p for span in assistant_spans(mask) for p in span] + [len(ids)]
    return [ids[a:b] for a, b in zip(cuts[::2], cuts[1::2])]


def _check(run) -> tuple[int, int]:
    """Every span against HF generate of the stored prefix -> (answers cut, answers stopped)."""
    model = run["model"]
    stops = list(model.generation_config.eos_token_id)
    rows = run["table"].to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(run["rows"])
    cut = stopped = changed = 0
    for r in rows:
        row = run["rows"][r["id"]]
        spans = assistant_spans(r["loss_mask"])
        assert len(spans) == len(row["conversation"]) // 2  # every turn regenerated, in order
        for a, b in spans:
            with torch.no_grad():
                gen = model.generate(input_ids=torch.tensor([r["input_ids"][:a]]), **run["images"](row),
                                     max_new_tokens=run["max_new"], do_sample=False,
                                     suppress_tokens=run["suppress"] or None)[0, a:].tolist()
            stop = next((k + 1 for k, t in enumerate(gen) if t in stops), None)
            assert r["input_ids"][a:b] == gen[:stop]
            stopped += stop is not None
            if stop is None:  # cut by max_new_tokens: closed with the turn's end token, unsupervised
                cut += 1
                assert r["input_ids"][b] in stops and not r["loss_mask"][b]
        # the prompts are the dataset's conversation: the stretches between answers are unchanged
        ids, mask = run["dataset_ids"](row)
        stored = [seg[1:] if seg and seg[0] in stops else seg for seg in _segments(r["input_ids"], r["loss_mask"])]
        assert stored == _segments(ids, mask)
        changed += r["input_ids"] != ids
    assert cut == run["metrics"]["figures"]["truncated_answers"] == run["index"]["truncated_answers"]
    assert changed > 0  # the target's answers are not the dataset's
    return cut, stopped


def test_reference_target_answers_are_its_own_greedy_generation(reference):
    cut, stopped = _check(reference)
    assert stopped > 0


def test_multi_turn_prompts_carry_the_targets_earlier_answers(random_next):
    """A random model's answer depends on its whole prompt: turn 2 equals generate on a prefix
    that holds the target's turn-1 answer, not the dataset's."""
    cut, _ = _check(random_next)
    assert cut > 0


def test_artifacts_record_the_answer_source(reference):
    assert reference["index"]["response_source"] == "target"
    assert reference["index"]["response_max_new_tokens"] == reference["max_new"]
    assert reference["table"].schema.metadata[b"response_source"] == b"target"
    assert reference["metrics"]["figures"]["generate_seconds"] >= 0


def test_qwen_answers_use_three_axis_positions(tmp_path):
    """The actor's regeneration step alone (no Ray) on a tiny random Qwen2.5-VL: its spans equal HF
    generate with mm_token_type_ids (3-axis M-RoPE), as Qwen's processor would pass them."""
    from jobs._precompute.stages import SelfDistill
    from jobs.lib.manifest_rows import encode_row
    from jobs.lib.storage import Storage
    from spec_core.targets import load_target
    from spec_core.targets import load_image_encoder
    from tests.spec_core.targets.saved_targets import save_qwen

    target = save_qwen(tmp_path / "qwen")
    model, encoder = load_target(target).model, load_image_encoder(target)
    rng = np.random.default_rng(4)
    rows = [{"id": f"q{i}", "image_bytes": png(*[(40, 24), (32, 16)][i % 2], seed=i),
             "conversation": conversation(rng, 1 + i % 2)} for i in range(3)]
    samples = [encode_row(row, encoder, Storage(), None) for row in rows]
    out, _ = SelfDistill(model, str(target), max_new_tokens=5, pad_id=0, batch_size=2)(samples)
    stops = list(model.generation_config.eos_token_id)
    for s in out:
        for a, b in assistant_spans(s["loss_mask"]):
            ids_1T = torch.tensor([s["input_ids"][:a]])
            images = {k: torch.from_numpy(v) for k, v in s["images"].items()}
            with torch.no_grad():
                gen = model.generate(input_ids=ids_1T, **images, **encoder.token_inputs(ids_1T), max_new_tokens=5,
                                     do_sample=False, suppress_tokens=[IMAGE])[0, a:].tolist()
            stop = next((k + 1 for k, t in enumerate(gen) if t in stops), None)
            assert s["input_ids"][a:b] == gen[:stop]
