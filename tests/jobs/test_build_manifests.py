import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from jobs.build_manifests import BuildManifestsConfig, main
from jobs.lib.config import load_config
from jobs.lib.records import samples_table
from jobs.lib.storage import Storage, join
from spec_core.reference import TASKS, make_split

REPO = Path(__file__).resolve().parents[2]
REFERENCE = str(REPO / "manifests" / "datasets" / "reference.yaml")


@pytest.fixture(scope="module")
def tiny_ref(tmp_path_factory) -> tuple[str, list[dict], list[dict]]:
    """The reference world's data tables (3 train + 2 eval samples per task), no model training."""
    ref = tmp_path_factory.mktemp("ref")
    train = [s for t in TASKS for s in make_split(t, 3, 0, "train")]
    evals = [s for t in TASKS for s in make_split(t, 2, 0, "eval")]
    (ref / "data").mkdir()
    pq.write_table(samples_table(train), ref / "data" / "train.parquet")
    pq.write_table(samples_table(evals), ref / "data" / "eval.parquet")
    return str(ref), train, evals


def config(out: str, manifests: list[str], **data) -> BuildManifestsConfig:
    return BuildManifestsConfig.model_validate(
        {"run": {"output_uri": out}, "data": {"manifests": manifests, "io_workers": 2, **data}})


def read(store: Storage, uri: str) -> list[dict]:
    fs, path = store.arrow_fs(uri)
    return pq.read_table(path, filesystem=fs).to_pylist()


def test_reference_manifest_builds(tmp_path, tiny_ref):
    ref, train, evals = tiny_ref
    m = main(config(str(tmp_path), [REFERENCE], vars={"REF": ref}))
    out, store = m["figures"]["manifest_uri"], Storage()
    report = json.loads(store.read_text(join(out, "manifest_report.json")))
    rows = read(store, join(out, "train.parquet"))
    dropped = sum(report["totals"]["dropped"].values())
    assert len(rows) + dropped == len(train) == 18 and report["overlap_after_decontamination"] == {
        "id": 0, "image_sha256": 0}
    source = {s["id"]: s for s in train + evals}
    for task in TASKS:
        ev = read(store, join(out, "eval", f"{task}.parquet"))
        assert [r["id"] for r in ev] == [f"eval-{task}-{i:06d}" for i in range(2)]
        assert {r["task"] for r in ev} == {task} and {r["split"] for r in ev} == {"eval"}
    for r in rows:  # the reference world's own columns are the oracle for bytes, hash and turns
        s = source[r["id"]]
        assert r["source"] == s["task"] == r["task"] and r["split"] == "train"
        assert r["image_bytes"] == s["image_png"] and r["image_uri"] is None
        assert r["image_sha256"] == s["image_sha256"] and r["conversation"] == s["conversation"]
    rejects = read(store, join(out, "rejects.parquet"))  # only decontamination can drop a row here
    assert len(rejects) == dropped and all(r["stage"] == "decontaminate" for r in rejects)
    assert m["counts"]["rows_train"] == len(rows) and not m["figures"]["skipped"]


def test_rerun_skips_and_force_rewrites_identical_files(tmp_path, tiny_ref):
    cfg = config(str(tmp_path), [REFERENCE], vars={"REF": tiny_ref[0]})
    out = Path(main(cfg)["figures"]["manifest_uri"])
    names = ["train.parquet", "rejects.parquet", "manifest_report.json",
             *[f"eval/{t}.parquet" for t in TASKS]]
    before = {n: (out / n).read_bytes() for n in names}
    again = main(cfg)
    assert again["figures"]["skipped"] and again["counts"]["rows_train"] == 0
    forced = main(cfg.model_copy(update={"data": cfg.data.model_copy(update={"force": True})}))
    assert not forced["figures"]["skipped"] and forced["figures"]["manifest_uri"] == str(out)
    assert {n: (out / n).read_bytes() for n in names} == before


def test_a_manifest_that_is_not_the_file_its_build_wrote_is_caught(tmp_path, tiny_ref, capfd):
    """The report records each file's size and sha256: a reader (check_manifest, which precompute
    and generate run on the driver before any work) stops in one line on a manifest swapped for
    another valid one, and a rerun of the build rebuilds instead of skipping."""
    from jobs.lib.manifest_rows import ManifestError, check_manifest

    cfg = config(str(tmp_path), [REFERENCE], vars={"REF": tiny_ref[0]})
    out, store = Path(main(cfg)["figures"]["manifest_uri"]), Storage()
    columns = ("id", "task", "conversation")
    assert check_manifest(store, str(out / "train.parquet"), columns) > 0
    assert check_manifest(store, str(out / "eval" / "captioning.parquet"), columns) == 2
    good = (out / "eval" / "captioning.parquet").read_bytes()
    (out / "eval" / "captioning.parquet").write_bytes((out / "eval" / "text_vqa.parquet").read_bytes())
    with pytest.raises(ManifestError) as e:
        check_manifest(store, str(out / "eval" / "captioning.parquet"), columns)
    assert "is not the file jobs/build_manifests.py wrote (eval/captioning.parquet " in str(e.value)
    assert "\n" not in str(e.value)
    again = main(cfg)
    assert not again["figures"]["skipped"] and "eval/captioning.parquet " in capfd.readouterr().err
    assert (out / "eval" / "captioning.parquet").read_bytes() == good


def png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (i, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def test_other_manifests_into_the_same_run_stop_before_any_work(tmp_path, tiny_ref):
    from jobs.lib.run_key import RunMismatch

    ref, _, _ = tiny_ref
    store = Storage()
    first = config(str(tmp_path), [REFERENCE], vars={"REF": ref})
    first.run.run_id = "reference"
    main(first)
    train = join(str(tmp_path), "build_manifests", "reference", "train.parquet")
    before = store.read_bytes(train)
    other = tmp_path / "ref2"
    (other / "data").mkdir(parents=True)
    pq.write_table(samples_table([s for t in TASKS for s in make_split(t, 1, 5, "train")]), other / "data" / "train.parquet")
    pq.write_table(samples_table([s for t in TASKS for s in make_split(t, 1, 5, "eval")]), other / "data" / "eval.parquet")
    second = config(str(tmp_path), [REFERENCE], vars={"REF": str(other)})
    second.run.run_id = "reference"
    with pytest.raises(RunMismatch, match=r"data\.vars"):
        main(second)
    assert store.read_bytes(train) == before


def test_s3_sources_and_output(tmp_path, s3_bucket):
    store = Storage()
    lines = [json.dumps({"id": str(i), "image": f"{i}.png", "turns": [f"q{i}"], "category": "c"}) for i in range(6)]
    store.write_text(f"{s3_bucket}/data/bench.jsonl", "\n".join(lines))
    for i in range(5):  # image 5 is missing: a reject, not a failure
        store.write_bytes(f"{s3_bucket}/data/img/{i}.png", png(i))
    (tmp_path / "m.yaml").write_text(
        "name: s3\nsources:\n  - name: bench\n    format: jsonl\n    uri: ${BUCKET}/data/*.jsonl\n"
        "    image: {field: image, root: '${BUCKET}/data/img'}\n    conversation: {kind: prompts}\n"
        "    task_field: category\n    split: {policy: random, n_train: 3, n_eval_max: 2}\n")
    m = main(config(f"{s3_bucket}/runs", [str(tmp_path / "m.yaml")], vars={"BUCKET": s3_bucket}))
    out = m["figures"]["manifest_uri"]
    assert out.startswith(s3_bucket + "/runs/build_manifests/m-")
    train, ev = read(store, join(out, "train.parquet")), read(store, join(out, "eval", "bench.parquet"))
    # RandomState(42).permutation(6) = [0, 1, 5, 2, 4, 3]: eval rows 0, 1; train rows 5, 2, 4
    assert [r["id"] for r in ev] == ["0", "1"] and [r["id"] for r in train] == ["2", "4"]
    assert train[0]["image_uri"] == f"{s3_bucket}/data/img/2.png"
    assert read(store, join(out, "rejects.parquet"))[0]["reason"] == f"image not found: {s3_bucket}/data/img/5.png"


def test_shipped_job_config_validates():
    cfg = load_config(BuildManifestsConfig, REPO / "manifests" / "jobs" / "build_manifests.yaml")
    assert cfg.data.manifests == ["manifests/datasets/reference.yaml"]
    assert cfg.data.vars == {"REF": "runs/reference/small"}


def test_cli_manifest_typo_exits_2_with_one_line(tmp_path):
    bad = Path(REFERENCE).read_text().replace("id_field: id", "id_feild: id")
    (tmp_path / "bad.yaml").write_text(bad)
    proc = subprocess.run([sys.executable, str(REPO / "jobs" / "build_manifests.py"),
                           "--set", f"data.manifests=[{tmp_path / 'bad.yaml'}]",
                           "--set", f"run.output_uri={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "runs").exists()
    assert proc.stderr.strip().count("\n") == 0 and "unknown field 'sources.0.id_feild'" in proc.stderr
