"""Storage outages between a job and its object store (moto behind tests/faultproxy.py, which
resets every connection while 'down'): a 15-second outage mid-run is ridden out by
jobs/precompute.py with every sample exactly once; one longer than `storage.retry_seconds`
stops it with one line (exit 1) and the rerun resumes to exactly once; the error keeps its one
line when it is raised inside a Ray actor or Ray Data stage; batch leases survive outages."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.lib.artifact_store import committed_shards, read_kind
from jobs.lib.storage import Storage, StorageConfig, StorageUnavailable, join
from spec_core.reference.tasks import TASKS, make_split
from tests.faultproxy import FaultProxy, wait_for
from tests.jobs.worlds import manifest_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def proxy(s3_server):
    p = FaultProxy(s3_server)
    yield p
    p.close()


# --- the one line, through Ray's wrappers (no cluster needed) ------------------------------------

def _exit_and_stderr(raise_it, capsys, *errors) -> tuple[int, str]:
    from jobs.lib.job import one_line_errors

    with pytest.raises(SystemExit) as info:
        with one_line_errors("precompute", *errors):
            raise_it()
    return info.value.code, capsys.readouterr().err


def test_one_line_errors_unwraps_ray(capsys):
    from botocore.exceptions import EndpointConnectionError
    from ray.exceptions import RayTaskError

    msg = "write s3://b/run/_committed/shard-00003.json: storage unreachable for 5.1 s (6 attempts)"
    actor = RayTaskError("Worker.__call__", "Traceback ...\n  File x\njobs.lib.storage.StorageUnavailable: " + msg,
                         StorageUnavailable(msg)).as_instanceof_cause()
    # a Ray Data stage (raise_original_map_exception): the UDF's own exception, retry advice appended
    data = StorageUnavailable(msg + "\nFailed to apply UDF transform after 1/1 attempts (total backoff 0.0s).")
    for err in (StorageUnavailable(msg), actor, data):
        def raise_it(err=err):
            raise err
        code, stderr = _exit_and_stderr(raise_it, capsys, FileNotFoundError, ConnectionError)
        assert code == 1 and stderr == f"precompute: StorageUnavailable: {msg}\n", stderr

    def boto():
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")
    code, stderr = _exit_and_stderr(boto, capsys, ConnectionError)
    assert code == 1 and stderr.startswith("precompute: EndpointConnectionError: Could not connect")

    bug = RayTaskError("f", "Traceback ...\nKeyError: 'x'", KeyError("x")).as_instanceof_cause()
    with pytest.raises(KeyError):  # anything else stays a traceback
        from jobs.lib.job import one_line_errors

        with one_line_errors("precompute", ConnectionError):
            raise bug


# --- batch leases ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_batch_leases_ride_out_an_outage(s3_bucket, proxy):
    from jobs._run_batches.batch_queue import BatchQueue

    store = Storage(StorageConfig(endpoint_url=proxy.url, retry_seconds=30))
    uri = s3_bucket + "/q"
    store.write_text(join(uri, "pending", "b1.yaml"), "job: generate\n")
    a = BatchQueue(store, uri, "host:a", lease_seconds=60)
    proxy.outage_in_background(3.0)
    lease = a.claim("b1")
    assert lease is not None and lease.generation == 0 and proxy.refused > 0
    assert BatchQueue(store, uri, "host:b", lease_seconds=60).claim("b1") is None  # held
    proxy.outage_in_background(3.0)
    a.renew(lease)
    a.finish(lease, "done", {"batch": "b1"})
    assert a.status("b1") == {"batch": "b1"} and a.pending() == []

    short = BatchQueue(Storage(StorageConfig(endpoint_url=proxy.url, retry_seconds=1)), uri, "host:c", 60)
    store.write_text(join(uri, "pending", "b2.yaml"), "job: generate\n")
    with proxy.outage(), pytest.raises(StorageUnavailable):  # an outage, never 'held by another'
        short.claim("b2")


# --- precompute through an outage ----------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An untrained tiny target (what it answers does not matter here; training it would cost a
    minute) and a manifest of 2 samples per task (12 rows: 6 shards of 2)."""
    from spec_core.reference.tasks import all_words, corpus_texts
    from spec_core.reference.vlm.build import TOKENIZER_VOCAB
    from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
    from spec_core.reference.vlm.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("outage")
    samples = [s for t in TASKS for s in make_split(t, 2, 0, "train")]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(all_words())], TOKENIZER_VOCAB)
    build_vlm(PRESETS["tiny"], tok, 0).save_pretrained(root / "target")
    build_processor(PRESETS["tiny"], tok).save_pretrained(root / "target")
    pq.write_table(pa.Table.from_pylist(manifest_rows(samples, split="train")), root / "train.parquet")
    return root, samples


def _precompute(world, out: str, endpoint: str, *sets: str) -> list[str]:
    root, _ = world
    return [sys.executable, str(REPO / "jobs/precompute.py"), "--config", str(REPO / "manifests/jobs/precompute.yaml"),
            "--set", f"run.output_uri={out}", "--set", "run.run_id=outage", "--set", f"storage.endpoint_url={endpoint}",
            "--set", f"data.manifest={root / 'train.parquet'}", "--set", "data.shard_size=2",
            "--set", f"target.path={root / 'target'}", "--set", "ray.num_cpus=2", "--set", "compute.batch_size=1",
            *[a for s in sets for a in ("--set", s)]]


def _markers(s3_server: str, bucket: str) -> int:
    """Commit markers as the store holds them (read straight from moto, not through the proxy)."""
    import boto3

    prefix = "out/precompute/outage/artifacts/_committed/"
    listing = boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return listing.get("KeyCount", 0)


def _run_with_outage(args: list[str], proxy: FaultProxy, s3_server: str, bucket: str, seconds: float | None):
    """Start the job; once its first shard is committed, take storage down for `seconds` (None:
    until the job exits). Returns (process result, stderr, job still running when storage went down)."""
    env = {**os.environ, "SPEC_NO_PROGRESS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out: dict[str, str] = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate())), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: _markers(s3_server, bucket) >= 1 or proc.poll() is not None, 100, 0.05)
        running = proc.poll() is None
        if seconds is None:
            with proxy.outage():
                reader.join(100)
        else:
            with proxy.outage():
                time.sleep(seconds)
            reader.join(100)
    finally:
        if proc.poll() is None:
            import signal

            os.killpg(proc.pid, signal.SIGKILL)
            reader.join(10)
    return proc.returncode, out.get("stderr", ""), running


def _exactly_once(bucket: str, samples: list[dict]) -> None:
    art = f"{bucket}/out/precompute/outage/artifacts"
    ids = read_kind(Storage(), art, "samples").column("id").to_pylist()
    assert len(ids) == len(set(ids)) == len(samples)  # 0 lost, 0 duplicated
    assert sorted(ids) == sorted(s["id"] for s in samples)
    assert sorted(committed_shards(Storage(), art)) == list(range(len(samples) // 2))


@pytest.mark.ray
@pytest.mark.slow
def test_precompute_rides_out_a_15s_outage(world, s3_server, s3_bucket, proxy):
    args = _precompute(world, s3_bucket + "/out", proxy.url)
    rc, stderr, running = _run_with_outage(args, proxy, s3_server, s3_bucket[len("s3://"):], 15.0)
    assert running, "the job finished before storage went down"
    assert rc == 0, stderr[-3000:]
    assert proxy.refused + proxy.cut > 0  # the job did meet the outage
    _exactly_once(s3_bucket, world[1])


@pytest.mark.ray
@pytest.mark.slow
def test_precompute_down_past_the_budget_is_one_line_then_resumes(world, s3_server, s3_bucket, proxy):
    args = _precompute(world, s3_bucket + "/out", proxy.url, "storage.retry_seconds=5")
    rc, stderr, running = _run_with_outage(args, proxy, s3_server, s3_bucket[len("s3://"):], None)
    assert running, "the job finished before storage went down"
    ours = [line for line in stderr.splitlines() if line.startswith("precompute")]
    # Ray's own log lines may precede it (worker output is prefixed '(Worker pid=...)'), but the
    # driver shows no traceback
    assert rc == 1 and not any(line.startswith("Traceback") for line in stderr.splitlines()), stderr[-3000:]
    assert len(ours) == 1 and ours == stderr.strip().splitlines()[-1:], stderr[-3000:]
    assert ours[0].startswith("precompute: StorageUnavailable: ") and "storage unreachable for " in ours[0]
    assert "storage.retry_seconds=5" in ours[0]
    done_before = _markers(s3_server, s3_bucket[len("s3://"):])
    assert 1 <= done_before < len(world[1]) // 2

    env = {**os.environ, "SPEC_NO_PROGRESS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)  # storage is back
    assert r.returncode == 0, r.stderr[-3000:]
    _exactly_once(s3_bucket, world[1])


def test_faults_inside_ray_are_one_line_with_their_cause(capsys):
    """A full disk or a refused permission inside a Ray task (its path kept), a Ray Train worker's
    failure (WorkerGroupError around it), an actor dead past its retries: one line, exit 1."""
    import errno

    from ray.exceptions import ActorDiedError, RayTaskError
    from ray.train.v2.api.exceptions import WorkerGroupError

    full = OSError(errno.ENOSPC, "No space left on device", "/out/run/samples/shard-00002.parquet")
    task = RayTaskError("TargetStage.__call__", "Traceback ...\nOSError: ...", full).as_instanceof_cause()
    workers = WorkerGroupError("rank 1: PermissionError", {
        1: RayTaskError("train_worker", "Traceback ...", PermissionError(errno.EACCES, "Permission denied",
                                                                         "/ckpt/step-4")).as_instanceof_cause(),
        3: RuntimeError("later")})
    cases = {task: "precompute: OSError: [Errno 28] No space left on device: '/out/run/samples/shard-00002.parquet'",
             workers: "precompute: PermissionError: [Errno 13] Permission denied: '/ckpt/step-4'"}
    for err, line in cases.items():
        def raise_it(err=err):
            raise err
        code, stderr = _exit_and_stderr(raise_it, capsys, ConnectionError)
        assert code == 1 and stderr == line + "\n", stderr

    def died():
        raise ActorDiedError()
    code, stderr = _exit_and_stderr(died, capsys, ConnectionError)
    assert code == 1 and stderr.startswith("precompute: ActorDiedError: ") and len(stderr.splitlines()) == 1, stderr


def test_real_faults_inside_real_ray_are_one_line(ray_local, tmp_path, capsys):
    """The same on real faults: a write that meets a full device (/dev/full: a real ENOSPC) inside
    a Ray task, and an actor whose process dies (past its retries), through Ray's own wrappers."""
    import os

    import ray

    @ray.remote(max_retries=0)
    def write_shard(path: str) -> None:
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()

    @ray.remote(max_restarts=0)
    class Worker:
        def die(self) -> None:
            os._exit(1)

    code, stderr = _exit_and_stderr(lambda: ray.get(write_shard.remote("/dev/full")), capsys, ConnectionError)
    assert code == 1 and stderr == "precompute: OSError: [Errno 28] No space left on device\n", stderr

    worker = Worker.remote()
    code, stderr = _exit_and_stderr(lambda: ray.get(worker.die.remote()), capsys, ConnectionError)
    assert code == 1 and stderr.startswith("precompute: ActorDiedError: ") and len(stderr.splitlines()) == 1, stderr
    assert "worker process has died" in stderr  # why, where Ray says it
