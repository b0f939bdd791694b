"""Ray start-up: join an existing cluster when one is present, else start a local one."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from jobs.lib.config import Strict


class RayConfig(Strict):
    """Where the job's Ray runs. address=None: RAY_ADDRESS if set (ray job submit sets it),
    else a new local cluster sized by num_cpus / num_gpus / object_store_mb."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_mb: int | None = None
    log_to_driver: bool = True


def where_am_i() -> dict:
    """The host, process and (inside Ray) node id of the caller: recorded with each unit of work,
    so a run shows how its work spread over a cluster."""
    import socket

    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return {"actor": f"{socket.gethostname()}:{os.getpid()}", "node": node}


class _StageErrorWithoutTraceback(logging.Filter):
    """Ray Data logs a failed stage's exception with its traceback before it raises that same
    exception in the driver. The job then says it once: a user error as one line, a bug with its
    traceback (jobs.lib.job.one_line_errors). Keep Ray's log line, drop its copy of the trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


class _StageErrorLeftToTheJob(logging.Filter):
    """Where a stage's exception reaches the driver before the dataset's first output, Ray Data's
    `omit_traceback_stdout` takes it (a RayTaskError of the stage's own exception, as
    `raise_original_map_exception` makes it) for a bug of Ray's own: 'Exception occurred in Ray
    Data or Ray Core internal code ... open an issue', then the whole trace. The job reports that
    exception itself (one line, or a bug's traceback once): drop Ray's records of it. Records
    logged while no such exception is being handled pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        from ray.exceptions import RayError, RayTaskError

        err = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        cause = getattr(err, "cause", None) if isinstance(err, RayTaskError) else None
        return cause is None or isinstance(cause, RayError)


# the loggers that report a Ray Data stage's exception on the driver before raising it, and
# the filter each gets
_STAGE_ERROR_LOGGERS = {"ray.data._internal.execution.streaming_executor_state": _StageErrorWithoutTraceback,
                        "ray.data._internal.execution.streaming_executor": _StageErrorWithoutTraceback,
                        "ray.data.exceptions": _StageErrorLeftToTheJob}


def _quiet_stage_tracebacks() -> None:
    for name, kind in _STAGE_ERROR_LOGGERS.items():
        log = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in log.filters):
            log.addFilter(kind())


# Where each local Ray a job starts is recorded (driver and Ray's processes, by pid and start time)
# until the driver exits. A driver killed by SIGKILL takes its GCS and raylet with it, but Ray's
# agents (DashboardAgent, RuntimeEnvAgent) live on as orphans, ~100 MB each; the next local start
# stops what such a record names (`stop_leftovers`).
def _records_dir() -> Path:
    return Path(os.environ.get("SPEC_RAY_RECORDS", Path.home() / ".cache" / "spec_core" / "ray-local"))


def _alive(pid: int, started: float) -> bool:
    """Whether process `pid` is the one that started at `started` (not a reused pid)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - started) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _record_local_ray() -> None:
    """Record this driver and the processes of the local Ray it just started; the record goes
    when the driver exits (atexit), and stays if it is killed."""
    import atexit

    import psutil

    me = psutil.Process()
    procs = {}
    for c in me.children(recursive=True):
        try:
            if "ray" in " ".join(c.cmdline()):
                procs[c.pid] = c.create_time()
        except psutil.Error:
            pass
    path = _records_dir() / f"{me.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"driver": [me.pid, me.create_time()], "procs": sorted(procs.items())}))
    atexit.register(path.unlink, missing_ok=True)


def stop_leftovers() -> int:
    """Stop the Ray processes of local clusters whose driver died without stopping them (SIGKILL,
    OOM): every record whose driver is gone, its processes still alive killed. Returns how many."""
    import signal

    stopped = 0
    for path in sorted(_records_dir().glob("*.json")) if _records_dir().is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if _alive(*rec["driver"]):
            continue
        for pid, started in rec["procs"]:
            if _alive(pid, started):
                try:
                    os.kill(pid, signal.SIGKILL)
                    stopped += 1
                except ProcessLookupError:
                    pass
        path.unlink(missing_ok=True)
    return stopped


def init_ray(cfg: RayConfig) -> dict:
    """Start or join Ray once per process; returns {'mode': 'joined'|'local', 'resources': {...}}."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return {"mode": "existing", "resources": ray.cluster_resources()}
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=cfg.log_to_driver)
        mode = "joined"
    else:
        # Ray Data's read_parquet starts a pool of footer-reading actors (32 by default) on every
        # execution, i.e. every training epoch: on one node they share its disk and network, and
        # on a few cores their start-up alone stalled each epoch's first batch by 20-40 s.
        os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")  # read by the workers started below
        if stopped := stop_leftovers():
            print(f"stopped {stopped} Ray processes that a killed earlier run left behind", file=sys.stderr)
        ray.init(
            address="local",
            num_cpus=cfg.num_cpus,
            num_gpus=cfg.num_gpus,
            object_store_memory=cfg.object_store_mb * 2**20 if cfg.object_store_mb else None,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",  # a local cluster talks over loopback only
            log_to_driver=cfg.log_to_driver,
        )
        _record_local_ray()
        mode = "local"
    # a Ray Data stage's own exception reaches the driver (not a UserCodeException that has lost
    # it), so jobs can tell an unreachable storage from a bug (jobs.lib.job.one_line_errors)
    ray.data.DataContext.get_current().raise_original_map_exception = True
    _quiet_stage_tracebacks()
    return {"mode": mode, "resources": ray.cluster_resources()}
