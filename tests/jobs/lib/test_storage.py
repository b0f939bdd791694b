import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.lib.storage import Storage, StorageConfig, join, run_dir, scheme_of


def roundtrip(store: Storage, base: str) -> None:
    uri = join(base, "a", "b.txt")
    assert not store.exists(uri)
    store.write_text(uri, "one")
    store.write_text(uri, "two")  # overwrite in place
    assert store.read_text(uri) == "two" and store.exists(uri)
    store.write_bytes(join(base, "a", "c.bin"), b"\x00\x01")
    assert store.list(join(base, "a")) == ["b.txt", "c.bin"]
    assert store.list(join(base, "missing")) == []
    assert sorted(u.rsplit("/", 1)[-1] for u in store.walk_files(base)) == ["b.txt", "c.bin"]
    store.delete(join(base, "a"), recursive=True)
    assert not store.exists(uri)


def test_uris():
    assert scheme_of("/tmp/x") == scheme_of("file:///tmp/x") == "file"
    assert scheme_of("s3://b/k") == "s3"
    with pytest.raises(ValueError, match="unsupported"):
        scheme_of("gs://b/k")
    assert run_dir("s3://b/out", "gen", "r1") == "s3://b/out/gen/r1"
    assert run_dir("out", "gen", "r1") == os.path.join("out", "gen", "r1")


def test_local_roundtrip_and_atomic_write(tmp_path):
    store = Storage()
    roundtrip(store, str(tmp_path))
    store.write_text(str(tmp_path / "x.json"), "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp file left behind


def test_s3_roundtrip(s3_bucket):
    roundtrip(Storage(), s3_bucket + "/prefix")


def test_s3_endpoint_from_config_overrides_env(s3_server, s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    store = Storage(StorageConfig(endpoint_url=s3_server))
    store.write_text(s3_bucket + "/k", "v")
    assert store.read_text(s3_bucket + "/k") == "v"


def test_parquet_roundtrip_pyarrow_s3(s3_bucket):
    store = Storage()
    table = pa.table({"id": ["a", "b"], "x": [1.5, 2.5], "img": [b"\x89PNG", b""]})
    fs, path = store.arrow_fs(s3_bucket + "/t/part.parquet")
    pq.write_table(table, path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).equals(table)


@pytest.mark.ray
def test_parquet_roundtrip_ray_data_s3(s3_bucket, ray_local):
    import ray

    store = Storage()
    rows = [{"id": f"s{i:03d}", "value": i * i, "blob": bytes([i % 256]) * 3} for i in range(200)]
    fs, path = store.arrow_fs(s3_bucket + "/ray/out")
    ray.data.from_items(rows, override_num_blocks=4).write_parquet(path, filesystem=fs)
    assert len([u for u in store.walk_files(s3_bucket + "/ray/out") if u.endswith(".parquet")]) >= 1
    back = ray.data.read_parquet(path, filesystem=fs).take_all()
    assert sorted(back, key=lambda r: r["id"]) == rows
