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


# --- riding out outages --------------------------------------------------------------------------

def _client_error(status: int, code: str):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


def _translated(status: int, code: str) -> OSError:
    """As s3fs raises it: a Python error whose __cause__ is botocore's."""
    from s3fs.errors import translate_boto_error

    return translate_boto_error(_client_error(status, code))


def test_only_connection_type_errors_are_retried():
    import errno

    from botocore.exceptions import (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                     ReadTimeoutError)

    from jobs.lib.storage import StorageUnavailable, is_transient

    url = "http://127.0.0.1:9/b/k"
    retried = [EndpointConnectionError(endpoint_url=url), ConnectionClosedError(endpoint_url=url),
               ReadTimeoutError(endpoint_url=url), ConnectTimeoutError(endpoint_url=url),
               ConnectionRefusedError(), ConnectionResetError(), TimeoutError(),
               _client_error(503, "SlowDown"), _client_error(500, "InternalError"), _client_error(429, "TooMany"),
               _client_error(400, "RequestTimeout"), _translated(503, "SlowDown"), _translated(500, "InternalError")]
    not_retried = [_client_error(404, "NoSuchKey"), _client_error(403, "AccessDenied"),
                   _client_error(412, "PreconditionFailed"), _translated(404, "NoSuchKey"),
                   _translated(403, "AccessDenied"), FileNotFoundError("k"), PermissionError("k"),
                   ValueError("bad"), StorageUnavailable("already gave up")]
    assert [type(e).__name__ for e in retried if not is_transient(e)] == []
    assert [repr(e) for e in not_retried if is_transient(e)] == []
    local_retried = [OSError(errno.ESTALE, "stale"), OSError(errno.EAGAIN, "again"), OSError(errno.ETIMEDOUT, "t")]
    local_not = [FileNotFoundError(errno.ENOENT, "x"), PermissionError(errno.EACCES, "x"),
                 OSError(errno.ENOSPC, "full"), FileExistsError(errno.EEXIST, "x"), ConnectionRefusedError()]
    assert all(is_transient(e, local=True) for e in local_retried)
    assert not any(is_transient(e, local=True) for e in local_not)


class FakeClock:
    """time.monotonic / time.sleep stand-ins: sleeping advances the clock."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_retry_call_retries_transient_errors_until_they_pass():
    from jobs.lib.storage import retry_call

    fake, calls = FakeClock(), []

    def flaky():
        calls.append(fake.now)
        if len(calls) < 4:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert retry_call(flaky, "write", "s3://b/k", 90, sleep=fake.sleep, clock=fake.clock) == "ok"
    assert len(calls) == 4 and len(fake.sleeps) == 3
    assert all(0.1 * 2 ** i <= s <= 0.2 * 2 ** i for i, s in enumerate(fake.sleeps))  # doubling, jittered


def test_retry_call_raises_other_errors_at_once():
    from jobs.lib.storage import retry_call

    fake, calls = FakeClock(), []

    def missing():
        calls.append(1)
        raise FileNotFoundError("s3://b/k")

    with pytest.raises(FileNotFoundError):
        retry_call(missing, "read", "s3://b/k", 90, sleep=fake.sleep, clock=fake.clock)
    assert calls == [1] and fake.sleeps == []


def test_retry_call_gives_up_after_the_budget_with_one_line():
    from botocore.exceptions import EndpointConnectionError

    from jobs.lib.storage import StorageUnavailable, retry_call

    fake = FakeClock()

    def down():
        fake.now += 0.5  # each attempt takes a while too
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")

    with pytest.raises(StorageUnavailable) as info:
        retry_call(down, "write", "s3://b/run/_committed/shard-00001.json", 30, sleep=fake.sleep, clock=fake.clock)
    err = info.value
    assert isinstance(err, ConnectionError) and isinstance(err.__cause__, EndpointConnectionError)
    assert 30 <= fake.now < 30 + 0.5 + 1e-9  # the last attempt starts when the budget ends
    assert sum(fake.sleeps) <= 30 and max(fake.sleeps) <= 5.0
    text = str(err)
    assert "\n" not in text and text.startswith("write s3://b/run/_committed/shard-00001.json: storage unreachable for 30")
    assert "storage.retry_seconds=30" in text and "EndpointConnectionError" in text
    # no budget: one attempt
    fake2, calls = FakeClock(), []
    with pytest.raises(StorageUnavailable):
        retry_call(lambda: calls.append(1) or down(), "read", "s3://b/k", 0, sleep=fake2.sleep, clock=fake2.clock)
    assert calls == [1] and fake2.sleeps == []


def test_backoff_is_exponential_with_bounded_jitter():
    import random

    from jobs.lib.storage import RETRY_BASE_S, RETRY_CAP_S, backoff_seconds

    rng = random.Random(0)
    for attempt in range(12):
        full = min(RETRY_CAP_S, RETRY_BASE_S * 2 ** attempt)
        assert backoff_seconds(attempt, lambda: 0.0) == pytest.approx(full / 2)
        assert backoff_seconds(attempt, lambda: 1.0) == pytest.approx(full)
        draws = [backoff_seconds(attempt, rng.random) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in draws) and len(set(draws)) > 100  # jittered
    assert backoff_seconds(30, rng.random) <= RETRY_CAP_S


def test_storage_unavailable_pickles_for_ray():
    import pickle

    from jobs.lib.storage import StorageUnavailable

    err = pickle.loads(pickle.dumps(StorageUnavailable("read s3://b/k: storage unreachable for 5.0 s")))
    assert type(err) is StorageUnavailable and str(err) == "read s3://b/k: storage unreachable for 5.0 s"


def test_s3_client_retries_in_standard_mode(s3_server):
    fs, _ = Storage(StorageConfig(endpoint_url=s3_server)).fs("s3://any/k")
    assert fs.s3.meta.config.retries["mode"] == "standard"


def test_create_exclusive_after_a_lost_response(s3_bucket, monkeypatch):
    """The PUT reached storage but its answer was lost: the retry's 412 is this call's own
    write, so it reports 'created'; an object someone else created stays theirs."""
    from botocore.exceptions import ConnectionClosedError

    store = Storage(StorageConfig(retry_seconds=5))
    fs, _ = store.fs(s3_bucket)
    real = fs.pipe_file
    plan: list[str] = []

    def flaky_pipe(path, data, **kw):
        what = plan.pop(0) if plan else "ok"
        if what == "lost":  # written, answer lost
            real(path, data, **kw)
        if what == "other":  # another writer gets there first, our request never arrives
            real(path, b"theirs")
        if what != "ok":
            raise ConnectionClosedError(endpoint_url="http://127.0.0.1/" + path)
        return real(path, data, **kw)

    monkeypatch.setattr(fs, "pipe_file", flaky_pipe)
    plan[:] = ["lost"]
    assert store.create_exclusive(s3_bucket + "/lease/000000.json", b"mine") is True
    assert store.read_bytes(s3_bucket + "/lease/000000.json") == b"mine"
    assert store.create_exclusive(s3_bucket + "/lease/000000.json", b"mine") is False  # a plain 412: exists
    plan[:] = ["other"]
    assert store.create_exclusive(s3_bucket + "/lease/000001.json", b"mine") is False
    assert store.read_bytes(s3_bucket + "/lease/000001.json") == b"theirs"


@pytest.fixture
def proxy(s3_server):
    from tests.faultproxy import FaultProxy

    p = FaultProxy(s3_server)
    yield p
    p.close()


@pytest.mark.slow  # the outage lasts 4 s
def test_storage_rides_out_an_outage(s3_bucket, proxy):
    """Through a proxy that resets every connection for 4 s: each kind of call, started during
    the outage, waits it out."""
    from concurrent.futures import ThreadPoolExecutor

    store = Storage(StorageConfig(endpoint_url=proxy.url, retry_seconds=30))
    base = s3_bucket + "/outage"
    store.write_text(base + "/a.txt", "one")
    store.write_text(base + "/gone.txt", "x")
    fs, path = store.arrow_fs(base + "/t.parquet")
    pq.write_table(pa.table({"x": [1, 2, 3]}), path, filesystem=fs)
    calls = [lambda: store.write_text(base + "/b.txt", "two"), lambda: store.read_text(base + "/a.txt"),
             lambda: store.list(s3_bucket), lambda: store.exists(base + "/a.txt"), lambda: store.exists(s3_bucket),
             lambda: store.create_exclusive(base + "/c.txt", b"three"),
             lambda: pq.read_table(path, filesystem=fs).num_rows, lambda: store.delete(base + "/gone.txt")]
    proxy.outage_in_background(4.0)
    with ThreadPoolExecutor(len(calls)) as pool:
        results = list(pool.map(lambda call: call(), calls))
    assert results == [None, "one", ["outage"], True, True, True, 3, None]
    assert proxy.refused > 0
    assert store.list(base) == ["a.txt", "b.txt", "c.txt", "t.parquet"] and store.read_text(base + "/c.txt") == "three"


def test_storage_down_past_the_budget_is_one_line(s3_bucket, proxy):
    import time

    from jobs.lib.storage import StorageUnavailable

    store = Storage(StorageConfig(endpoint_url=proxy.url, retry_seconds=1.5))
    store.write_text(s3_bucket + "/k", "v")
    with proxy.outage():
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailable) as info:
            store.read_text(s3_bucket + "/k")
        waited = time.monotonic() - t0
    assert waited >= 1.5
    assert str(info.value).startswith(f"read {s3_bucket}/k: storage unreachable for ")
    assert "\n" not in str(info.value)
    with pytest.raises(FileNotFoundError):  # a 4xx is never retried
        store.read_text(s3_bucket + "/missing")
