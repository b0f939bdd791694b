"""Shared fixtures: an S3-compatible server on 127.0.0.1 (moto) and one local Ray per module."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Settings for the Ray clusters, Ray workers and job subprocesses that tests start (all inherit this
# environment). None changes what a test checks; on a 2-core machine each saves seconds per run:
# Ray Data's Parquet reads start 32 footer-reading actors per execution (as jobs.lib.ray_setup's
# local clusters, one here); DeepSpeed's ZeRO optimizer check imports its Muon kernels, whose
# torch.compile wrappers import inductor (~2 s per training worker; nothing here compiles); Ray Train
# adds a preemption-watcher actor per run and polls its workers every 2 s.
TEST_ENV = {"RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "1", "TORCHDYNAMO_DISABLE": "1",
            "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)

RAY_FIXTURES = {"ray_local"}
RAY_SESSION = "/tmp/ray/session_latest"  # Ray points it at every new cluster's session directory


def _ray_session() -> str | None:
    try:
        return os.readlink(RAY_SESSION)
    except OSError:
        return None


@pytest.fixture(autouse=True)
def _ray_tests_are_marked(request):
    """Fails a test that starts a Ray cluster (in this process or in a subprocess it runs) without
    the `ray` marker, so that `-m "not ray"` means what it says."""
    before = _ray_session()
    yield
    if request.node.get_closest_marker("ray") is None and _ray_session() != before:
        pytest.fail("this test started a Ray cluster: mark it `ray` (pytestmark = pytest.mark.ray)")


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on loopback; yields its endpoint URL. Credentials are dummies, set in the
    environment so that Ray workers started later inherit them too."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket per test; yields 's3://<bucket>'."""
    import boto3

    name = "t-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40]
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def ray_local():
    """One small in-process Ray cluster per test module."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1",
             object_store_memory=256 * 2**20)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@contextmanager
def ray_head_cluster(*extra_args: str):
    """A separate `ray start --head --block` cluster (with the dashboard, for `ray job submit`) in
    its own process group, on loopback; yields (GCS address, env, dashboard URL). The env puts
    this interpreter's bin first on PATH, so that `python` in a submitted job is ours.
    `extra_args` go to `ray start` (e.g. --num-gpus=1: a GPU resource that Ray schedules by)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    port, dash = free_port(), free_port()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    head = subprocess.Popen(
        [str(Path(bin_dir) / "ray"), "start", "--head", "--block", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=true",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}", *extra_args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"127.0.0.1:{port}", env, f"http://127.0.0.1:{dash}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:  # `ray start --block` rarely exits on SIGTERM alone: a short grace, then the group goes
            head.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        marker = Path("/tmp/ray/ray_current_cluster")  # left behind by `ray start`
        if marker.is_file() and str(port) in marker.read_text():
            marker.unlink()


def pytest_collection_modifyitems(config, items):
    """A test that asks for a Ray fixture is a `ray` test; `gpu` tests need CUDA: without it they
    are skipped (and only they are)."""
    import torch

    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs CUDA (marker: gpu)")
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
        if no_cuda is not None and "gpu" in item.keywords:
            item.add_marker(no_cuda)
