import json

import pyarrow.parquet as pq
import pytest

from jobs.lib.job import RunSection
from jobs.lib.storage import Storage, join
from jobs.synth_data import SynthDataConfig, main

pytestmark = pytest.mark.ray


def config(out: str, **data) -> SynthDataConfig:
    return SynthDataConfig.model_validate({
        "run": {"output_uri": out},
        "data": {"per_task": {"train": 3, "eval": 2}, "rows_per_block": 4, **data},
    })


def read_split(store: Storage, uri: str):
    fs, path = store.arrow_fs(uri)
    return pq.read_table(path, filesystem=fs)


def test_local_run_writes_data_and_records(tmp_path, ray_local):
    cfg = config(str(tmp_path))
    m = main(cfg)
    store, run = Storage(), cfg.run_dir("synth_data")
    train = read_split(store, join(run, "data", "train"))
    assert train.num_rows == 18 and sorted(set(train["task"].to_pylist())) == sorted(cfg.data.tasks)
    assert len(set(train["id"].to_pylist())) == 18
    row = train.slice(0, 1).to_pylist()[0]
    assert row["image_png"][:4] == b"\x89PNG" and row["conversation"][0]["role"] == "user"
    assert read_split(store, join(run, "data", "eval")).num_rows == 12
    saved = json.loads(store.read_text(join(run, "metrics.json")))
    assert saved["counts"] == {"samples_train": 18, "samples_eval": 12} == m["counts"]
    assert saved["config_hash"] and store.exists(join(run, "config.yaml"))
    assert store.exists(join(run, "report.md"))


def test_resume_redoes_only_the_unfinished_split(tmp_path, ray_local):
    cfg = config(str(tmp_path))
    main(cfg)
    store, run = Storage(), cfg.run_dir("synth_data")
    before = sorted(read_split(store, join(run, "data", "eval"))["image_sha256"].to_pylist())
    store.delete(join(run, "data", "eval", "_SUCCESS"))  # as if killed while writing eval
    m = main(cfg)
    assert m["counts"] == {"samples_train": 0, "samples_eval": 12}
    after = sorted(read_split(store, join(run, "data", "eval"))["image_sha256"].to_pylist())
    assert after == before  # deterministic and not duplicated


def test_resume_redoes_a_split_whose_files_do_not_match_its_marker(tmp_path, ray_local, capfd):
    """A truncated file, a file copied in beside the others (duplicate rows for every reader) and
    a marker without checksums each make a rerun redo that split, said in one line."""
    import shutil

    cfg = config(str(tmp_path))
    main(cfg)
    store, run = Storage(), cfg.run_dir("synth_data")
    train, ev = join(run, "data", "train"), join(run, "data", "eval")
    before = sorted(read_split(store, train)["id"].to_pylist())
    first = sorted(n for n in store.list(train) if n.endswith(".parquet"))[0]
    shutil.copy(join(train, first), join(train, "copy-" + first))
    path = join(ev, sorted(n for n in store.list(ev) if n.endswith(".parquet"))[0])
    store.write_bytes(path, store.read_bytes(path)[:-100])
    m = main(cfg)
    assert m["counts"] == {"samples_train": 18, "samples_eval": 12}
    err = capfd.readouterr().err
    assert f"split train does not match its marker (copy-{first} is not in its marker" in err
    assert "split eval does not match its marker (" in err and " bytes, its marker says " in err
    assert sorted(read_split(store, train)["id"].to_pylist()) == before  # no duplicate row left
    store.write_text(join(ev, "_SUCCESS"), "12")  # a marker of an older version: no checksums
    assert main(cfg)["counts"] == {"samples_train": 0, "samples_eval": 12}


def test_another_seed_into_the_same_run_stops_or_restarts(tmp_path, ray_local):
    from jobs.lib.run_key import RunMismatch

    cfg = config(str(tmp_path)).model_copy(update={"run": RunSection(output_uri=str(tmp_path), run_id="r")})
    main(cfg)
    other = cfg.model_copy(update={"data": cfg.data.model_copy(update={"seed": 1})})
    with pytest.raises(RunMismatch, match=r"data\.seed: 0 -> 1"):
        main(other)
    m = main(other.model_copy(update={"run": RunSection(output_uri=str(tmp_path), run_id="r", on_mismatch="restart")}))
    assert m["counts"] == {"samples_train": 18, "samples_eval": 12}  # everything again, for seed 1 only


def test_s3_output(s3_bucket, ray_local):
    cfg = config(s3_bucket + "/runs", tasks=["text_vqa", "chart_vqa"])
    main(cfg)
    store = Storage()
    table = read_split(store, join(cfg.run_dir("synth_data"), "data", "train"))
    assert table.num_rows == 6 and set(table["task"].to_pylist()) == {"text_vqa", "chart_vqa"}


def test_the_hires_world_shares_each_image_among_the_six_tasks(tmp_path, ray_local):
    from spec_core.reference import hires

    cfg = config(str(tmp_path), world="hires")
    main(cfg)
    rows = read_split(Storage(), join(cfg.run_dir("synth_data"), "data", "train")).to_pylist()
    assert len(rows) == 18 and len({r["image_sha256"] for r in rows}) == 3
    row = next(r for r in rows if r["id"] == "train-chart_vqa-000002")
    assert row == hires.make_sample(2, "chart_vqa", 0, "train")


def test_an_output_location_that_refuses_writes_is_one_line_and_exit_1(tmp_path):
    """A read-only output directory (for root, who writes anywhere a mode allows: sysfs, which
    refuses new files to everyone) stops the job in one line naming the path, exit 1, before Ray."""
    import os
    import subprocess
    import sys
    import uuid

    from tests.conftest import REPO

    if os.geteuid() == 0:
        out = f"/sys/kernel/spec-{uuid.uuid4().hex[:8]}"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        out = str(tmp_path / "ro" / "out")
    r = subprocess.run([sys.executable, "jobs/synth_data.py", "--set", f"run.output_uri={out}",
                        "--set", "data.per_task={train: 1}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert r.stderr.startswith("synth_data: PermissionError: ") and out in r.stderr, r.stderr
