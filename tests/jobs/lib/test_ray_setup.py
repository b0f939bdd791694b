"""Ray start-up: a Ray Data stage failing before any output is reported once; a local Ray left by a
killed driver is stopped by the next start. (A job joining the cluster in RAY_ADDRESS, and `ray job
submit`: tests/docs/test_guide.py.)"""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.ray


_FAILING_STAGE = """
import sys
import time
import ray
from jobs.lib.job import one_line_errors
from jobs.lib.ray_setup import RayConfig, init_ray
from jobs.lib.storage import StorageUnavailable

class Stage:
    def __init__(self, kind):
        self.kind = kind

    def __call__(self, batch):
        if self.kind == "storage":
            raise StorageUnavailable("write s3://b/k: storage unreachable for 5.0 s")
        raise KeyError("a bug")

init_ray(RayConfig(num_cpus=2))
ds = ray.data.range(4, override_num_blocks=2).map_batches(Stage, fn_constructor_args=(sys.argv[1],),
                                                                compute=ray.data.ActorPoolStrategy(size=1), batch_size=2)
with one_line_errors("precompute", ConnectionError):
    for _ in ds.iter_rows():  # the stage fails before the dataset's first output
        pass
"""


def test_a_stage_failing_before_any_output_is_said_once(tmp_path):
    """A stage's exception that reaches the driver before any output is the job's to report:
    a user error in one line without Ray's 'internal code' trace, a bug with one traceback."""
    script = tmp_path / "stage.py"
    script.write_text(_FAILING_STAGE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    said = {}
    for kind in ("storage", "bug"):
        said[kind] = r = subprocess.run([sys.executable, str(script), kind], cwd=REPO, env=env,
                                        capture_output=True, text=True, timeout=240)
        assert "Ray Data or Ray Core internal code" not in r.stderr, r.stderr[-3000:]
    storage, bug = said["storage"], said["bug"]
    assert storage.returncode == 1, storage.stderr[-3000:]
    assert not any(line.startswith("Traceback") for line in storage.stderr.splitlines()), storage.stderr[-3000:]
    assert storage.stderr.strip().splitlines()[-1] == (
        "precompute: StorageUnavailable: write s3://b/k: storage unreachable for 5.0 s")
    # a bug: the job's own traceback, once, ending in the stage's exception
    assert bug.returncode == 1 and bug.stderr.count("Traceback (most recent call last)") == 1, bug.stderr[-3000:]
    assert bug.stderr.strip().splitlines()[-1].startswith("KeyError: 'a bug"), bug.stderr[-3000:]


_LOCAL_DRIVER = """
import time
from jobs.lib.ray_setup import RayConfig, init_ray
init_ray(RayConfig(num_cpus=1))
print("ready", flush=True)
time.sleep(600)
"""


def test_a_local_ray_left_by_a_killed_driver_is_stopped_by_the_next_start(tmp_path, monkeypatch):
    """A driver killed by SIGKILL leaves Ray's agents running as orphans; the next job's local
    start (`stop_leftovers`, run by init_ray) stops every process its record names, and only them."""
    import signal

    import psutil

    from jobs.lib import ray_setup

    env = {**os.environ, "SPEC_RAY_RECORDS": str(tmp_path / "records"), "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-c", _LOCAL_DRIVER], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "ready"
        (record,) = (tmp_path / "records").glob("*.json")
        procs = json.loads(record.read_text())["procs"]
        assert any("raylet" in " ".join(psutil.Process(p).cmdline()) for p, _ in procs), procs
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    time.sleep(3)  # what fate-shares with the driver (GCS, raylet) is gone by now
    left = [p for p, t in procs if ray_setup._alive(p, t)]
    assert left, "nothing was left: Ray now stops its agents itself, and stop_leftovers can go"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setenv("SPEC_RAY_RECORDS", env["SPEC_RAY_RECORDS"])
    try:
        assert ray_setup.stop_leftovers() == len(left)
        time.sleep(1)
        assert not [p for p, t in procs if ray_setup._alive(p, t)]
        assert not list((tmp_path / "records").glob("*.json")) and bystander.poll() is None
    finally:
        bystander.kill()
