"""The sections every job config shares, and the run context a job writes into."""

from __future__ import annotations

from pydantic import Field

from jobs.lib.config import Strict, config_hash
from jobs.lib.ray_setup import RayConfig
from jobs.lib.storage import StorageConfig, run_dir


class RunSection(Strict):
    """Where outputs go. run_id=None -> 'cfg-<hash of the config>': re-running the same config
    lands in the same run directory, which is how killed jobs resume."""

    output_uri: str = "runs"
    run_id: str | None = None


class ActorPoolSection(Strict):
    """An actor pool: its size and each actor's resources (a GPU fraction shares a GPU). Jobs
    subclass it as their `compute` section and add their batching fields."""

    num_actors: int = Field(1, ge=1, description="actor pool size (model replicas)")
    num_gpus_per_actor: float = Field(0.0, ge=0)
    num_cpus_per_actor: float = Field(1.0, gt=0)


class JobConfig(Strict):
    """Root of every job config: subclass it and add the job's own sections."""

    run: RunSection = RunSection()
    storage: StorageConfig = StorageConfig()
    ray: RayConfig = RayConfig()

    def resolved_run_id(self) -> str:
        if self.run.run_id:
            return self.run.run_id
        # The hash leaves out where the run is written and how Ray is reached: the same work
        # submitted from another machine or into another bucket keeps its id.
        work = self.model_copy(update={"run": RunSection(), "ray": RayConfig(), "storage": StorageConfig()})
        return f"cfg-{config_hash(work)}"

    def run_dir(self, job: str) -> str:
        return run_dir(self.run.output_uri, job, self.resolved_run_id())


def job_entry(job: str):
    """(config class, main) of `jobs/<job>.py`: its one JobConfig subclass and its main()."""
    import importlib

    module = importlib.import_module(f"jobs.{job}")
    (cls,) = {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, JobConfig)
              and v is not JobConfig and v.__module__ == module.__name__}
    return cls, module.main
