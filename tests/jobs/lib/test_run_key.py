"""jobs/lib/run_key.py: a run directory belongs to one computing config, locally and on S3."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from jobs.lib.config import Strict
from jobs.lib.job import ActorPoolSection, JobConfig
from jobs.lib.run_key import KEY_FILE, RunMismatch, computing_fields, fingerprint, open_run, run_key
from jobs.lib.storage import Storage, join


class Data(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"io_workers"})

    limit: int | None = None
    shard_size: int = 64
    io_workers: int = 8


class Compute(ActorPoolSection):
    batch_size: int = 8


class Job(JobConfig):
    data: Data = Data()
    compute: Compute = Compute()


def _cfg(out: str, run_id: str | None = "r", on_mismatch: str = "fail", **data) -> Job:
    return Job.model_validate({"run": {"output_uri": out, "run_id": run_id, "on_mismatch": on_mismatch},
                               "data": data, "compute": {"num_actors": 3}})


def test_computing_fields_leave_out_where_and_how_a_run_runs():
    cfg = Job.model_validate({"run": {"output_uri": "s3://b/x", "run_id": "a"}, "storage": {"region": "eu"},
                              "ray": {"num_cpus": 3}, "data": {"limit": 5, "io_workers": 2},
                              "compute": {"num_actors": 4, "num_cpus_per_actor": 2, "batch_size": 2}})
    assert computing_fields(cfg) == {"data.limit": 5, "data.shard_size": 64, "compute.batch_size": 2}


def test_default_run_id_follows_only_the_computing_fields(tmp_path):
    a, b = _cfg(str(tmp_path), None), _cfg(str(tmp_path / "elsewhere"), None, io_workers=1)
    b.compute.num_actors = 9
    assert a.resolved_run_id() == b.resolved_run_id() != _cfg(str(tmp_path), None, limit=5).resolved_run_id()


@pytest.fixture(params=["local", "s3"])
def out(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "runs")
    return request.getfixturevalue("s3_bucket") + "/runs"


def test_the_same_config_resumes_and_another_stops_naming_the_fields(out):
    store = Storage()
    key = open_run(_cfg(out, limit=5), "job", store, {"target": "abc"})
    run_dir = _cfg(out).run_dir("job")
    store.write_text(join(run_dir, "_committed", "shard-00000.json"), "{}")
    assert open_run(_cfg(out, limit=5, io_workers=1), "job", store, {"target": "abc"}) == key  # resume
    with pytest.raises(RunMismatch) as err:
        open_run(_cfg(out, limit=13, shard_size=32), "job", store, {"target": "abd"})
    line = str(err.value)
    assert "\n" not in line and "data.limit: 5 -> 13" in line and "data.shard_size: 64 -> 32" in line
    assert "input target: abc -> abd" in line and "run.on_mismatch=restart" in line
    assert store.exists(join(run_dir, "_committed", "shard-00000.json"))  # nothing was touched
    assert json.loads(store.read_text(join(run_dir, KEY_FILE)))["hash"] == key["hash"]


def test_restart_removes_the_old_run_and_claims_the_directory(out, capsys):
    store = Storage()
    open_run(_cfg(out, limit=5), "job", store)
    run_dir = _cfg(out).run_dir("job")
    store.write_text(join(run_dir, "_committed", "shard-00000.json"), "{}")
    key = open_run(_cfg(out, "r", "restart", limit=13), "job", store)
    assert "removed the previous run" in capsys.readouterr().out
    assert store.list(run_dir) == [KEY_FILE]
    assert json.loads(store.read_text(join(run_dir, KEY_FILE)))["hash"] == key["hash"]
    assert open_run(_cfg(out, "r", "fail", limit=13), "job", store) == key  # and then resumes


def test_outputs_without_a_key_are_not_taken_for_this_run(tmp_path):
    store, out = Storage(), str(tmp_path)
    store.write_text(join(_cfg(out).run_dir("job"), "config.yaml"), "old: true")
    with pytest.raises(RunMismatch, match="written without a run key"):
        open_run(_cfg(out), "job", store)
    open_run(_cfg(out, "r", "restart"), "job", store)
    assert store.list(_cfg(out).run_dir("job")) == [KEY_FILE]


def test_the_key_holds_no_secret(tmp_path):
    cfg = Job.model_validate({"storage": {"secret_access_key": "s3cr3t", "access_key_id": "id"}})
    assert "s3cr3t" not in json.dumps(run_key(cfg, "job"))


def test_fingerprint_tells_a_rebuilt_model_apart_at_the_same_path(tmp_path):
    store = Storage()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    big = bytearray(b"\0" * (3 << 20))
    (model / "model.safetensors").write_bytes(bytes(big))
    first = fingerprint(store, str(model))
    assert fingerprint(store, str(model)) == first
    big[2 << 20] = 1  # same size, other weights (within a sampled chunk)
    (model / "model.safetensors").write_bytes(bytes(big))
    assert fingerprint(store, str(model)) != first
    assert fingerprint(store, str(model / "config.json")) != fingerprint(store, str(model))
