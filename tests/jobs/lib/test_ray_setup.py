"""Ray start-up: a job joins the cluster named by RAY_ADDRESS (as `ray job submit` sets it)."""

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.ray


def test_job_joins_the_cluster_in_ray_address(ray_head, tmp_path):
    address, env, _ = ray_head
    cmd = [sys.executable, "jobs/synth_data.py", "--set", f"run.output_uri={tmp_path}",
           "--set", "data.per_task={train: 1}", "--set", "data.tasks=[text_vqa]"]
    for _attempt in range(3):  # the head may still be coming up
        r = subprocess.run(cmd, cwd=REPO, env={**env, "RAY_ADDRESS": address, "SPEC_NO_PROGRESS": "1"},
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            break
        time.sleep(3)
    assert r.returncode == 0, r.stderr[-2000:]
    metrics = next(tmp_path.rglob("metrics.json"))
    assert json.loads(metrics.read_text())["figures"]["ray"] == "joined"
