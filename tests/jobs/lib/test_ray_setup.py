"""Ray start-up: a job joins the cluster named by RAY_ADDRESS (as `ray job submit` sets it)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.ray


@pytest.fixture
def ray_head(tmp_path):
    """A separate `ray start --head --block` cluster in its own process group, on loopback."""
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    ray_bin = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--num-cpus=1", "--include-dashboard=false",
         f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        marker = Path("/tmp/ray/ray_current_cluster")  # left behind by `ray start`
        if marker.is_file() and str(port) in marker.read_text():
            marker.unlink()


def test_job_joins_the_cluster_in_ray_address(ray_head, tmp_path):
    address, env = ray_head
    cmd = [sys.executable, "jobs/synth_data.py", "--set", f"run.output_uri={tmp_path}",
           "--set", "data.per_task={train: 1}", "--set", "data.tasks=[text_vqa]"]
    for attempt in range(3):  # the head may still be coming up
        r = subprocess.run(cmd, cwd=REPO, env={**env, "RAY_ADDRESS": address, "SPEC_NO_PROGRESS": "1"},
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            break
        time.sleep(3)
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = next(tmp_path.rglob("metrics.json"))
    assert json.loads(metrics.read_text())["figures"]["ray"] == "joined"
