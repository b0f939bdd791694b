"""Every file under cluster/ parses, has the right kind and apiVersion and the fields its tool needs,
runs the project's image on Ray's current GPU image, and every RayJob entrypoint names an existing
job with an existing config that validates (overrides included)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import ray
import yaml

from jobs.lib.config import load_config
from jobs.lib.job import job_entry
from tests.conftest import REPO

CLUSTER = Path(REPO) / "cluster"
YAMLS = sorted(CLUSTER.rglob("*.yaml"))
RAY_IMAGE = f"rayproject/ray:{ray.__version__}-py311-gpu"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def by_kind(kind: str) -> list[tuple[Path, dict]]:
    return [(p, d) for p in YAMLS for d in docs(p) if d.get("kind") == kind]


def containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def test_every_yaml_parses_and_is_a_known_kind():
    assert YAMLS
    for p in YAMLS:
        for d in docs(p):
            if "kind" in d:
                assert d["kind"] in {"RayCluster", "RayJob", "RayCronJob", "CronJob"}, p
                assert d["apiVersion"] == ("batch/v1" if d["kind"] == "CronJob" else "ray.io/v1"), p
            else:  # the Ray cluster launcher
                assert {"cluster_name", "provider", "available_node_types", "head_node_type"} <= set(d), p


def test_the_image_is_rays_current_gpu_image():
    base = [line.split()[1] for line in (CLUSTER / "Dockerfile").read_text().splitlines() if line.startswith("FROM")]
    assert base == [RAY_IMAGE]  # ray-ml images are discontinued
    ignored = (Path(REPO) / ".dockerignore").read_text().split()
    assert {".venv", "runs", ".git"} <= set(ignored)


def test_launcher_has_a_cpu_head_and_autoscaling_gpu_workers():
    (p,) = [p for p in YAMLS if "kind" not in docs(p)[0]]
    d = docs(p)[0]
    types = d["available_node_types"]
    assert d["head_node_type"] in types and types[d["head_node_type"]]["resources"].get("CPU") == 0
    workers = [t for n, t in types.items() if n != d["head_node_type"]]
    assert workers and all(t["max_workers"] > t.get("min_workers", 0) for t in workers)
    assert any("--shm-size" in o for o in d["docker"]["run_options"])


def _check_ray_cluster_spec(spec: dict, where: Path) -> None:
    assert spec["rayVersion"] == ray.__version__, where
    head = spec["headGroupSpec"]
    assert head["rayStartParams"].get("num-cpus") == "0", where
    for c in containers(head["template"]):
        assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), where
    groups = spec["workerGroupSpecs"]
    assert groups, where
    for g in groups:
        pod = g["template"]
        for c in containers(pod):
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1, where
            assert any(m["mountPath"] == "/dev/shm" for m in c.get("volumeMounts", [])), where
        dshm = [v for v in pod["spec"]["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        assert dshm, where
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], where
    for pod in [head["template"]] + [g["template"] for g in groups]:
        for c in containers(pod):
            env = {e["name"] for e in c.get("env", [])}
            assert not env & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, "credentials come from a Secret"


def test_ray_cluster():
    found = by_kind("RayCluster")
    assert found
    for p, d in found:
        _check_ray_cluster_spec(d["spec"], p)


def _check_entrypoint(entrypoint: str, where: Path) -> str:
    argv = shlex.split(entrypoint)
    assert argv[0] == "python" and argv[1].startswith("jobs/") and (Path(REPO) / argv[1]).is_file(), where
    job = Path(argv[1]).stem
    config = argv[argv.index("--config") + 1]
    assert (Path(REPO) / config).is_file(), where
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    load_config(job_entry(job)[0], Path(REPO) / config, overrides)  # validates, or raises ConfigError
    return job


def _check_runtime_env(text: str, where: Path) -> None:
    env = yaml.safe_load(text)
    assert {".venv", "runs", ".git"} <= set(env.get("excludes", [])), where
    assert not set(env.get("env_vars", {})) & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, where


def test_ray_jobs_run_existing_jobs_with_valid_configs():
    found = by_kind("RayJob")
    jobs = set()
    for p, d in found:
        spec = d["spec"]
        jobs.add(_check_entrypoint(spec["entrypoint"], p))
        _check_runtime_env(spec["runtimeEnvYAML"], p)
        _check_ray_cluster_spec(spec["rayClusterSpec"], p)
        assert spec["shutdownAfterJobFinishes"] is True, p
    assert {"precompute", "train_drafter", "generate"} <= jobs


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(CLUSTER)))
def test_no_secret_values_in_any_file(path):
    text = path.read_text()
    assert "AKIA" not in text  # an access key id
    assert not re.search(r"(?i)aws_secret_access_key\s*[:=]\s*\S", text)  # a value, not a mention


def test_schedules_run_the_batch_scheduler():
    crons = by_kind("RayCronJob")
    assert crons
    for p, d in crons:
        assert "feature gate" in p.read_text()  # alpha: the file says what it needs
        spec = d["spec"]
        assert len(spec["schedule"].split()) == 5, p
        tmpl = spec["jobTemplate"]
        assert _check_entrypoint(tmpl["entrypoint"], p) == "run_batches"
        _check_runtime_env(tmpl["runtimeEnvYAML"], p)
        _check_ray_cluster_spec(tmpl["rayClusterSpec"], p)
    plain = by_kind("CronJob")
    assert plain
    for p, d in plain:
        assert len(d["spec"]["schedule"].split()) == 5, p
        (c,) = containers(d["spec"]["jobTemplate"]["spec"]["template"])
        argv = c["command"]
        assert argv[:3] == ["ray", "job", "submit"] and "--" in argv, p
        assert any(a.startswith("--address=http://") for a in argv), p
        runtime = next(a.split("=", 1)[1] for a in argv if a.startswith("--runtime-env-json="))
        _check_runtime_env(runtime, p)
        assert _check_entrypoint(shlex.join(argv[argv.index("--") + 1:]), p) == "run_batches"
