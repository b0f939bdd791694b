import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from jobs.lib.config import ConfigError
from jobs._build_manifests.manifests import (MANIFEST_SCHEMA, REJECT_SCHEMA, DatasetManifest, SourceError, build,
                                cap_train, decontaminate, load_manifest, overlap, random_split,
                                shuffle_split)
from jobs.lib.storage import Storage, join

REPO = Path(__file__).resolve().parents[3]
# np.random.RandomState(42).permutation(10), the draw sklearn's ShuffleSplit(random_state=42) makes
PERM_42_10 = [8, 1, 5, 0, 7, 2, 9, 4, 3, 6]


def png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (i % 256, i // 256, 7)).save(buf, format="PNG")
    return buf.getvalue()


def jsonl_source(tmp_path: Path, name: str, rows: list[dict], **spec) -> dict:
    """Writes <name>.jsonl (+ the images named by `png`: index) and returns its source spec."""
    (tmp_path / "img").mkdir(exist_ok=True)
    lines = []
    for r in rows:
        if isinstance(r.get("png"), int):
            (tmp_path / "img" / f"{r['png']}.png").write_bytes(png(r["png"]))
        r = {**r, "image": f"{r['png']}.png" if isinstance(r.get("png"), int) else r.get("image")}
        lines.append(json.dumps({k: v for k, v in r.items() if k != "png"}))
    (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return {"name": name, "format": "jsonl", "uri": str(tmp_path / f"{name}.jsonl"),
            "image": {"field": "image", "root": str(tmp_path / "img")},
            "conversation": {"kind": "prompts"}, **spec}


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"s{i}", "png": i, "turns": [f"question {i}?"]} for i in range(start, start + n)]


def read(uri) -> list[dict]:
    return pq.read_table(uri).to_pylist()


def test_shuffle_split_reproduces_sklearn():
    # sklearn's documented example: train_test_split(range(5), test_size=0.33, random_state=42)
    # gives train [2, 0, 3] and test [1, 4].
    train, test = shuffle_split(5, 3, 2)
    assert train.tolist() == [2, 0, 3] and test.tolist() == [1, 4]
    train, test = random_split(10, n_train=3, n_eval_max=4)  # test first, then train, in draw order
    assert test.tolist() == PERM_42_10[:4] and train.tolist() == PERM_42_10[4:7]
    train, test = random_split(10, n_train=3, n_eval_max=3000)  # "up to": the 7 remaining rows
    assert test.tolist() == PERM_42_10[:7] and train.tolist() == PERM_42_10[7:]
    assert cap_train(10, 3).tolist() == PERM_42_10[7:]  # train_test_split(train_size=3)
    assert cap_train(3, 5).tolist() == [0, 1, 2]


def test_random_split_sizes_and_disjoint():
    train, test = random_split(5000, 1000, 3000)
    assert len(train) == 1000 and len(test) == 3000 and not set(train) & set(test)
    train, test = random_split(1500, 1000, 3000)
    assert len(train) == 1000 and len(test) == 500 and len(set(train) | set(test)) == 1500
    with pytest.raises(ValueError, match="more than n_train=1000"):
        random_split(1000, 1000, 3000)


def test_decontaminate_by_id_and_by_image():
    ev = [{"id": "e1", "source": "bench", "image_sha256": "h1"}, {"id": "e2", "source": "bench", "image_sha256": "h2"}]
    tr = [{"id": "e1", "source": "pool", "image_sha256": "x"}, {"id": "t2", "source": "pool", "image_sha256": "h2"},
          {"id": "t3", "source": "pool", "image_sha256": "h3"}]
    assert overlap(tr, ev) == {"id": 1, "image_sha256": 1}
    kept, dropped = decontaminate(tr, ev)
    assert [r["id"] for r in kept] == ["t3"] and overlap(kept, ev) == {"id": 0, "image_sha256": 0}
    assert [r["reason"] for r in dropped] == ["id in eval: bench", "image in eval: bench e2"]


def test_build_splits_decontaminates_and_reports(tmp_path):
    bench = jsonl_source(tmp_path, "bench", rows(10), task_field="category",
                         split={"policy": "random", "n_train": 3, "n_eval_max": 4})
    evals = jsonl_source(tmp_path, "evalonly", rows(2, start=100), split={"policy": "eval_only"})
    pool_rows = rows(3, start=200) + [{"id": "s100", "png": 300, "turns": ["same id as an eval row"]},
                                      {"id": "p-dup", "png": 101, "turns": ["same image, other id"]}]
    pool = jsonl_source(tmp_path, "pool", pool_rows, task="general", split={"policy": "train_only"})
    manifest = DatasetManifest.model_validate({"name": "t", "sources": [bench, evals, pool]})
    report = build([manifest], str(tmp_path / "out"), workers=2)

    train = read(tmp_path / "out" / "train.parquet")
    bench_eval = read(tmp_path / "out" / "eval" / "bench.parquet")
    # the ShuffleSplit oracle: eval = rows PERM[:4], train = rows PERM[4:7], in draw order
    assert [r["id"] for r in bench_eval] == [f"s{i}" for i in PERM_42_10[:4]]
    assert [r["id"] for r in train if r["source"] == "bench"] == [f"s{i}" for i in PERM_42_10[4:7]]
    assert [r["id"] for r in train if r["source"] == "pool"] == ["s200", "s201", "s202"]
    assert pq.read_schema(tmp_path / "out" / "train.parquet").equals(MANIFEST_SCHEMA)
    all_eval = bench_eval + read(tmp_path / "out" / "eval" / "evalonly.parquet")
    assert overlap(train, all_eval) == {"id": 0, "image_sha256": 0}
    assert report["overlap_after_decontamination"] == {"id": 0, "image_sha256": 0}
    assert report["sources"]["pool"]["dropped"] == {"id in eval": 1, "image in eval": 1}
    assert report["totals"]["dropped"] == {"id in eval": 1, "image in eval": 1}
    assert report["sources"]["bench"] | {"unused": 3, "train": 3, "eval": 4} == report["sources"]["bench"]
    rejects = read(tmp_path / "out" / "rejects.parquet")
    assert {(r["id"], r["stage"], r["reason"]) for r in rejects} == {
        ("s100", "decontaminate", "id in eval: evalonly"),
        ("p-dup", "decontaminate", "image in eval: evalonly s101")}
    row = train[0]
    assert row["conversation"][0]["content"].startswith("<image>\n") and row["image_bytes"] is None
    assert row["image_uri"].startswith(str(tmp_path / "img")) and len(row["image_sha256"]) == 64
    assert json.loads((tmp_path / "out" / "manifest_report.json").read_text())["totals"]["train"] == 6


def test_bad_rows_go_to_rejects_and_the_build_completes(tmp_path):
    good = rows(2)
    bad = [{"id": "missing", "image": "nope.png", "turns": ["q?"]},
           {"id": "corrupt", "image": "corrupt.png", "turns": ["q?"]},
           {"id": "empty", "png": 50, "turns": []},
           {"id": "s0", "png": 51, "turns": ["duplicate id"]},
           {"png": 52, "turns": ["no id"]}]
    src = jsonl_source(tmp_path, "src", good + bad, split={"policy": "train_only"})
    (tmp_path / "img" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with open(src["uri"], "a") as f:
        f.write("{broken json\n")
    manifest = DatasetManifest.model_validate({"name": "t", "sources": [src]})
    report = build([manifest], str(tmp_path / "out"), workers=2)
    assert [r["id"] for r in read(tmp_path / "out" / "train.parquet")] == ["s0", "s1"]
    rejects = {r["row"]: r for r in read(tmp_path / "out" / "rejects.parquet")}
    assert pq.read_schema(tmp_path / "out" / "rejects.parquet").equals(REJECT_SCHEMA)
    reasons = {k: r["reason"].split(":")[0] for k, r in rejects.items()}
    assert reasons == {"2": "image not found", "3": "image unreadable", "4": "empty conversation",
                       "5": "duplicate id", "6": "missing id", "7": "invalid record"}
    assert rejects["2"]["id"] == "missing" and rejects["5"]["reason"] == "duplicate id: also at row 0"
    assert report["sources"]["src"]["rejected"] == 6 and report["totals"]["train"] == 2


def test_official_split_by_field_with_cap(tmp_path):
    data = [{"id": f"r{i}", "png": i, "turns": ["q"], "split": "train" if i < 6 else "test"} for i in range(8)]
    data.append({"id": "nosplit", "png": 9, "turns": ["q"]})
    src = jsonl_source(tmp_path, "off", data, split={"policy": "official", "field": "split", "n_train": 3})
    report = build([DatasetManifest.model_validate({"name": "t", "sources": [src]})], str(tmp_path / "o"))
    # cap: train_test_split(range(6), train_size=3, random_state=42) -> the last 3 of the draw
    expected = [f"r{i}" for i in np.random.RandomState(42).permutation(6)[3:]]
    assert [r["id"] for r in read(tmp_path / "o" / "train.parquet")] == expected
    assert [r["id"] for r in read(tmp_path / "o" / "eval" / "off.parquet")] == ["r6", "r7"]
    assert report["sources"]["off"]["unused"] == 3
    assert read(tmp_path / "o" / "rejects.parquet")[0]["reason"] == "missing split: no value in 'split'"


def test_a_source_that_cannot_be_built_fails_before_writing(tmp_path):
    ok = jsonl_source(tmp_path, "ok", rows(3), split={"policy": "eval_only"})
    small = jsonl_source(tmp_path, "small", rows(3), split={"policy": "random", "n_train": 3})
    missing = {**ok, "name": "missing", "uri": str(tmp_path / "nope" / "*.jsonl")}
    (tmp_path / "bad.json").write_text("{not json")
    broken = {**ok, "name": "broken", "format": "json", "uri": str(tmp_path / "bad.json")}
    cases = [(missing, "source 'missing': no file matches"), (broken, "source 'broken': .* is not valid JSON"),
             (small, "source 'small': a random split needs more than n_train=3 rows, the source has 3")]
    for src, message in cases:
        with pytest.raises(SourceError, match=message):
            build([DatasetManifest.model_validate({"name": "t", "sources": [ok, src]})], str(tmp_path / "out"))
        assert not (tmp_path / "out").exists()


def write_manifest(tmp_path: Path, text: str) -> str:
    (tmp_path / "m.yaml").write_text(text)
    return str(tmp_path / "m.yaml")


GOOD = """name: t
sources:
  - name: a
    format: jsonl
    uri: ${ROOT}/a.jsonl
    conversation: {kind: prompts}
    split: {policy: eval_only}
"""


def test_manifest_typos_are_one_line_config_errors(tmp_path):
    assert load_manifest(write_manifest(tmp_path, GOOD), {"ROOT": "/d"}).sources[0].uri == "/d/a.jsonl"
    cases = {"conversation:": "conversaton:", "eval_only": "eval_onyl", "format: jsonl": "format: jsnol"}
    for good, typo in cases.items():
        with pytest.raises(ConfigError) as err:
            load_manifest(write_manifest(tmp_path, GOOD.replace(good, typo)), {"ROOT": "/d"})
        assert "\n" not in str(err.value) and str(tmp_path / "m.yaml") in str(err.value)
    with pytest.raises(ConfigError, match="unknown field 'sources.0.conversaton'"):
        load_manifest(write_manifest(tmp_path, GOOD.replace("conversation:", "conversaton:")), {"ROOT": "/d"})
    with pytest.raises(ConfigError, match=r"\$\{ROOT\}, which is not set"):
        load_manifest(write_manifest(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="per-split 'uri' mapping needs split.policy official"):
        load_manifest(write_manifest(tmp_path, GOOD.replace("${ROOT}/a.jsonl", "{test: a.jsonl}")))


def test_shipped_dataset_manifests_validate_without_data():
    ref = load_manifest(str(REPO / "manifests" / "datasets" / "reference.yaml"), {"REF": "/nowhere"})
    assert [s.name for s in ref.sources] == ["general_vqa", "text_vqa", "captioning", "chart_vqa",
                                             "reasoning", "multi_turn"]
    assert {s.uri["eval"] for s in ref.sources} == {"/nowhere/data/eval.parquet"}
    paper = load_manifest(str(REPO / "manifests" / "datasets" / "fovea_paper.yaml"), {"DATA_ROOT": "/data"})
    policies = {s.name: s.split.policy for s in paper.sources}
    assert policies == {"llava_mix665k": "train_only", "mmt_bench": "random", "seed_bench_2": "random",
                        "mathvista": "random", "ocrbench": "random", "scienceqa": "official",
                        "chartqa": "official", "textvqa": "eval_only", "mme": "eval_only", "mmspec": "eval_only"}
    llava = paper.sources[0]
    assert llava.split.n_train == 51671 and llava.image.root == "/data/llava/images"
    assert all(s.split.n_train == 1000 for s in paper.sources[1:7])
    assert all(s.split.n_eval_max == 3000 and s.split.seed == 42 for s in paper.sources[1:5])
    sqa = paper.sources[5]  # a DatasetDict folder; its splits named by the uri keys
    assert sqa.format == "hf_disk" and sqa.uri == {"train": "/data/scienceqa", "test": "/data/scienceqa"}
    assert (sqa.conversation.context, sqa.conversation.answer_format) == ("hint", "letter")
    assert len({s.id_prefix for s in paper.sources}) == 10  # no two numbering schemes collide


# ---------------------------------------------------------------- real-format sources, local and s3://

SUFFIX = "Answer with the option's letter from the given choices directly."


@pytest.fixture
def no_network(monkeypatch):
    """HF offline, and any connection beyond loopback (where moto listens) fails the test."""
    import socket

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tried, connect = [], socket.socket.connect

    def loopback_only(sock, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            tried.append(address)
            raise OSError(f"test: no network beyond loopback, not {address}")
        return connect(sock, address)
    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    yield
    assert not tried, f"network access attempted: {tried}"


@pytest.fixture(params=["local", "s3"])
def data_root(request, tmp_path, no_network) -> str:
    return str(tmp_path / "data") if request.param == "local" else request.getfixturevalue("s3_bucket") + "/data"


def save_scienceqa(datasets, root: str) -> None:
    """A ScienceQA DatasetDict as the Hub has it (Image column, int8 `answer` index into
    `choices`, `hint` often empty, no id), written by the real `save_to_disk` to <root>/scienceqa."""
    from jobs.lib.storage import StorageConfig, _s3_kwargs

    feats = datasets.Features({"image": datasets.Image(), "question": datasets.Value("string"),
                               "choices": datasets.List(datasets.Value("string")),
                               "answer": datasets.Value("int8"), "hint": datasets.Value("string"),
                               "category": datasets.Value("string"), "lecture": datasets.Value("string")})
    img = lambda i: {"bytes": png(i), "path": None}  # noqa: E731
    q = lambda image, question, choices, answer, hint: {  # noqa: E731
        "image": image, "question": question, "choices": choices, "answer": answer, "hint": hint,
        "category": "Identify animals", "lecture": "not mapped"}
    splits = {"train": [q(img(1), "Which is a mammal?", ["frog", "whale", "trout"], 1, "Look at the picture."),
                        q(None, "Text only?", ["yes", "no"], 0, ""),  # skipped: no image
                        q(img(2), "Which is hotter?", ["ice", "lava"], 1, ""),
                        q(img(3), "Broken?", ["yes", "no"], 5, "")],  # index out of range
              "test": [q(img(4), "Which is a bird?", ["owl", "cat", "dog", "eel"], 0, "Owls fly at night."),
                       q(img(5), "Which is a fish?", ["owl", "cat", "dog", "eel"], 3, "")]}
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict({c: [r[c] for r in v] for c in feats}, features=feats)
                               for k, v in splits.items()})
    dd.save_to_disk(join(root, "scienceqa"), storage_options=_s3_kwargs(StorageConfig()) if "://" in root else None)


def test_scienceqa_as_saved_by_datasets_with_the_shipped_mapping(data_root, tmp_path):
    """The shipped ScienceQA entry over a real `DatasetDict.save_to_disk` folder: letter answers,
    the Context line only where the hint is set, embedded image bytes, an out-of-range answer
    rejected with its reason, an image-less row skipped."""
    datasets = pytest.importorskip("datasets")
    save_scienceqa(datasets, data_root)
    paper = load_manifest(str(REPO / "manifests" / "datasets" / "fovea_paper.yaml"), {"DATA_ROOT": data_root})
    manifest = DatasetManifest(name="t", sources=[s for s in paper.sources if s.name == "scienceqa"])
    out = join(data_root, "out")
    report = build([manifest], out, Storage(), workers=2)

    train, evals = read_uri(join(out, "train.parquet")), read_uri(join(out, "eval", "scienceqa.parquet"))
    user = lambda *lines: {"role": "user", "content": "<image>\n" + "\n".join([*lines, SUFFIX])}  # noqa: E731
    assert [(r["id"], r["conversation"]) for r in train] == [
        ("scienceqa/train-0", [user("Context: Look at the picture.", "Which is a mammal?", "A. frog", "B. whale",
                                    "C. trout"), {"role": "assistant", "content": "B"}]),
        ("scienceqa/train-2", [user("Which is hotter?", "A. ice", "B. lava"), {"role": "assistant", "content": "B"}])]
    assert [(r["id"], r["conversation"][0]["content"].splitlines()[1], r["conversation"][1]["content"])
            for r in evals] == [("scienceqa/test-0", "Context: Owls fly at night.", "A"),
                                ("scienceqa/test-1", "Which is a fish?", "D")]
    assert [r["image_bytes"] for r in train + evals] == [png(i) for i in (1, 2, 4, 5)]
    assert {r["task"] for r in train + evals} == {"Identify animals"} and train[0]["image_uri"] is None
    assert [(r["row"], r["reason"]) for r in read_uri(join(out, "rejects.parquet"))] == [
        ("train-3", "bad answer: index 5 in 'answer' is out of range of the 2 choices in 'choices'")]
    assert report["sources"]["scienceqa"]["text_only_skipped"] == 1
    assert report["sources"]["scienceqa"]["rejected bad answer"] == 1


def test_a_datasetdict_folder_needs_its_split_named(data_root):
    datasets = pytest.importorskip("datasets")
    save_scienceqa(datasets, data_root)
    src = {"name": "sqa", "format": "hf_disk", "uri": join(data_root, "scienceqa"), "id_field": None,
           "image": {"field": "image"}, "conversation": {"kind": "qa", "choices": "choices", "answer": "answer"},
           "split": {"policy": "eval_only"}}
    with pytest.raises(SourceError, match=r"source 'sqa': .*scienceqa holds a DatasetDict \(splits train, test\)"):
        build([DatasetManifest.model_validate({"name": "t", "sources": [src]})], join(data_root, "out"), Storage())
    src = {**src, "uri": join(data_root, "scienceqa", "test")}  # one split's folder is a Dataset
    report = build([DatasetManifest.model_validate({"name": "t", "sources": [src]})], join(data_root, "out"), Storage())
    assert report["totals"]["eval"] == 2


def test_chartqa_hub_parquet_with_embedded_image_structs(data_root):
    """ChartQA as the Hub's Parquet shards have it (written by `Dataset.to_parquet`: Image structs
    {bytes, path}, `label` a list of answers, no id), read with pyarrow from globs."""
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({"image": datasets.Image(), "query": datasets.Value("string"),
                               "label": datasets.List(datasets.Value("string")),
                               "human_or_machine": datasets.ClassLabel(names=["human", "machine"])})
    store, shards = Storage(), {"train": [(10, "What is the peak value?", ["42"]), (11, "Which year?", ["2019"])],
                                "test": [(12, "How many bars?", ["7"]), (None, "Corrupt?", ["x"])]}
    for split, items in shards.items():
        image = [{"bytes": png(i) if i is not None else b"\x89PNG broken", "path": f"{split}.png"} for i, _, _ in items]
        ds = datasets.Dataset.from_dict({"image": image, "query": [q for _, q, _ in items],
                                         "label": [a for _, _, a in items], "human_or_machine": [0, 1]}, features=feats)
        buf = io.BytesIO()
        ds.to_parquet(buf)
        store.write_bytes(join(data_root, "chartqa", "data", f"{split}-00000-of-00001.parquet"), buf.getvalue())
    fs, path = store.arrow_fs(join(data_root, "chartqa", "data", "test-00000-of-00001.parquet"))
    assert b"huggingface" in pq.read_schema(path, filesystem=fs).metadata  # a Hub-style file
    src = {"name": "chartqa", "format": "parquet", "id_field": None, "id_prefix": "chartqa/",
           "uri": {s: join(data_root, "chartqa", "data", f"{s}-*.parquet") for s in shards},
           "image": {"field": "image"}, "conversation": {"kind": "qa", "question": "query", "answer": "label"},
           "split": {"policy": "official", "train_values": ["train"], "eval_values": ["test"], "n_train": 1000}}
    out = join(data_root, "out")
    build([DatasetManifest.model_validate({"name": "t", "sources": [src]})], out, store)
    rows = read_uri(join(out, "train.parquet")) + read_uri(join(out, "eval", "chartqa.parquet"))
    assert [(r["id"], r["conversation"], r["image_bytes"]) for r in rows] == [
        (f"chartqa/{row}", [{"role": "user", "content": f"<image>\n{q}"}, {"role": "assistant", "content": a[0]}], png(i))
        for row, (i, q, a) in [("train-0", shards["train"][0]), ("train-1", shards["train"][1]),
                               ("test-0", shards["test"][0])]]
    [reject] = read_uri(join(out, "rejects.parquet"))
    assert reject["row"] == "test-1" and reject["reason"].startswith("image unreadable: embedded bytes")


def read_uri(uri: str) -> list[dict]:
    fs, path = Storage().arrow_fs(uri)
    return pq.read_table(path, filesystem=fs).to_pylist()
