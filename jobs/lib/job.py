"""The sections every job config shares, and the run context a job writes into."""

from __future__ import annotations

import errno
import sys
from contextlib import contextmanager
from typing import Any, ClassVar, Literal
from collections.abc import Callable, Iterable, Iterator

from pydantic import Field

from jobs.lib.config import EXIT_CONFIG_ERROR, ConfigError, Strict, cli
from jobs.lib.ray_setup import RayConfig
from jobs.lib.storage import StorageConfig, connection_errors, run_dir


class RunSection(Strict):
    """Where outputs go. run_id=None -> 'cfg-<hash of the computing config>': re-running the same
    config lands in the same run directory, which is how killed jobs resume. A run directory
    belongs to one computing config (jobs.lib.run_key): on_mismatch says what a rerun with another
    one does - stop before any work (fail) or remove the old run and start afresh (restart)."""

    output_uri: str = "runs"
    run_id: str | None = None
    on_mismatch: Literal["fail", "restart"] = "fail"


class TargetSection(Strict):
    """The frozen target VLM, the `target` section of every job that reads one; a job that needs
    more of it extends this (LoadedTargetSection; precompute's StoredTargetSection)."""

    path: str = Field("runs/reference/small/target", description="the target's model directory: a local path, "
                      "or any storage URI (s3://: downloaded once per node, jobs.lib.model_cache)")


class LoadedTargetSection(TargetSection):
    """A target a job runs itself, in the dtype it chooses (precompute, generate, benchmark)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU


class ActorPoolSection(Strict):
    """An actor pool: its size and each actor's resources (a GPU fraction shares a GPU). Jobs
    subclass it as their `compute` section and add their batching fields."""

    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"num_actors", "num_gpus_per_actor", "num_cpus_per_actor"})

    num_actors: int = Field(1, ge=1, description="actor pool size (model replicas)")
    num_gpus_per_actor: float = Field(0.0, ge=0)
    num_cpus_per_actor: float = Field(1.0, gt=0)


class DecodeComputeSection(ActorPoolSection):
    """An actor pool that decodes (generate, benchmark, generate_images): with compiled steps or not
    (spec_core.decoding.compiled; outputs are the same either way)."""

    NOT_COMPUTING: ClassVar[frozenset[str]] = ActorPoolSection.NOT_COMPUTING | {"compile", "compile_cache"}

    compile: Literal["auto", "on", "off"] = Field(
        "auto", description="decode steps under torch.compile (CUDA graphs on a GPU): auto is on, on a GPU and on a "
        "CPU alike (docs/results.md: the compiled engine); off: eager, for debugging")
    compile_cache: str = Field("~/.cache/spec_core/torchinductor", description="inductor's cache on each node "
                               "(TORCHINDUCTOR_CACHE_DIR): a later run of a job loads the kernels it compiled")


def compile_enabled(mode: str) -> bool:
    """compute.compile on an actor: on and off as said; auto on (measured worth it on both kinds of
    device: docs/results.md)."""
    return mode != "off"


def use_compile_cache(directory: str) -> None:
    """Point inductor's on-disk cache at `directory` (this process and the workers it starts)."""
    import os

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.expanduser(directory)


class PriceSection(Strict):
    gpu: float | None = Field(None, ge=0, description="price of one GPU-hour, any currency (null: no cost line)")
    cpu: float | None = Field(None, ge=0, description="price of one CPU-hour, any currency (null: no cost line)")


class CostSection(Strict):
    """Prices that turn the device-seconds of metrics.json's cost block into money (jobs.lib.metrics)."""

    price_per_device_hour: PriceSection = PriceSection()


class JobConfig(Strict):
    """Root of every job config: subclass it and add the job's own sections. A section lists in
    NOT_COMPUTING the fields that cannot change a run's outputs (jobs.lib.run_key)."""

    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"run", "storage", "ray", "cost"})

    run: RunSection = RunSection()
    storage: StorageConfig = StorageConfig()
    ray: RayConfig = RayConfig()
    cost: CostSection = CostSection()

    def resolved_run_id(self) -> str:
        if self.run.run_id:
            return self.run.run_id
        # Only the computing fields: the same work submitted from another machine, into another
        # bucket or with more actors keeps its id.
        from jobs.lib.run_key import computing_fields, key_hash

        return f"cfg-{key_hash(computing_fields(self.computing()))}"

    def computing(self) -> JobConfig:
        """The config as far as it determines outputs (a job may drop parts it does not run)."""
        return self

    def run_dir(self, job: str) -> str:
        return run_dir(self.run.output_uri, job, self.resolved_run_id())


def job_entry(job: str):
    """(config class, main) of `jobs/<job>.py`, imported by package name (so that Ray workers
    unpickle its config classes by reference, not as `__main__`): the JobConfig subclass it
    defines, else the one it imports from the room it shares with another job, and its main()."""
    import importlib

    module = importlib.import_module(f"jobs.{job}")
    found = {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, JobConfig) and v is not JobConfig}
    (cls,) = {v for v in found if v.__module__ == module.__name__} or found
    return cls, module.main


def run_job(job: str, summary: Callable[[Any, dict], Iterable[str]], *user_errors: type[BaseException]) -> None:
    """Every job's `__main__`: `--config FILE --set k=v` -> its config (a typo or an out-of-range
    value: one line, exit 2) -> main() under `one_line_errors(job, *user_errors)` -> the
    `summary(cfg, metrics)` lines, each as 'job: line'."""
    cls, main = job_entry(job)
    cfg = cli(cls, description=sys.modules[f"jobs.{job}"].__doc__)
    with one_line_errors(job, *user_errors):
        m = main(cfg)
    for line in summary(cfg, m):
        print(f"{job}: {line}")


# OSErrors that are the machine's or the user's to fix, not bugs: a full disk or quota, a read-only
# filesystem, a permission refused (its path is in the message)
FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


@contextmanager
def one_line_errors(job: str, *user_errors: type[BaseException]) -> Iterator[None]:
    """Around a job's main(): a run of another config in the run directory (RunMismatch) or a
    config error -> its one line on stderr, exit 2; the job's `user_errors` (unreadable inputs,
    unreachable storage), an OSError of `FAULTS` (full disk, read-only, permission) and an actor
    that died past its retries -> 'job: Type: message', exit 1, also when raised inside a Ray task,
    actor, Ray Data stage or Ray Train worker. Anything else is a bug: a traceback."""
    from jobs.lib.run_key import RunMismatch

    try:
        yield
    except Exception as raised:
        err = ray_cause(raised)
        kind, message = type(err), (str(err).splitlines() or [""])[0]
        if issubclass(kind, (RunMismatch, ConfigError)):
            print(message, file=sys.stderr)
            raise SystemExit(EXIT_CONFIG_ERROR) from None
        # botocore's connection errors (raw out of pyarrow / Ray Data I/O) count as ConnectionError
        boto = connection_errors() if "botocore" in sys.modules else ()
        died = sys.modules.get("ray.exceptions") and isinstance(err, sys.modules["ray.exceptions"].ActorDiedError)
        if died:  # its first line says only that it died: add why, where Ray says
            why = [ln.strip() for ln in str(err).splitlines() if "dead because" in ln or "exit detail" in ln.lower()]
            message = " ".join([message, *why[:1]])
        if (issubclass(kind, user_errors) or (issubclass(kind, boto) and issubclass(ConnectionError, user_errors))
                or (isinstance(err, OSError) and err.errno in FAULTS) or died):
            print(f"{job}: {kind.__name__}: {message}", file=sys.stderr)
            raise SystemExit(1) from None
        raise


def ray_cause(err: BaseException) -> BaseException:
    """The user's exception inside Ray's wrappers: a task's or actor's RayTaskError holds it as
    `.cause` (its own str() is a whole traceback); Ray Train's WorkerGroupError holds each failed
    worker's (the lowest rank's is taken); Ray Data stages raise the original exception (init_ray
    sets `raise_original_map_exception`), whose message may carry Ray Data's retry advice after
    its first line."""
    ray_exc = sys.modules.get("ray.exceptions")
    train_exc = sys.modules.get("ray.train.v2.api.exceptions")
    for _ in range(8 if ray_exc else 0):
        if isinstance(err, ray_exc.RayTaskError) and err.cause is not None and err.cause is not err:
            err = err.cause
        elif isinstance(err, ray_exc.UserCodeException) and err.__cause__ is not None:
            err = err.__cause__
        elif train_exc and isinstance(err, train_exc.WorkerGroupError) and err.worker_failures:
            err = err.worker_failures[min(err.worker_failures)]
        else:
            break
    return err
