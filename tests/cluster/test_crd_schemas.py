"""Every KubeRay document under cluster/kuberay/ validates against KubeRay's CRD schema as
`kubectl apply --validate=strict` does (an unknown field is an error), the plain CronJob uses only
batch/v1 CronJobSpec fields, and cluster/ray-cluster.yaml validates against Ray's ray-schema.json.

The CRD schemas are a pruned copy (tests/cluster/crds/kuberay.json, made by
scripts/prune_kuberay_crds.py from the KubeRay release named in its "source")."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from tests.conftest import REPO

CLUSTER = Path(REPO) / "cluster"
KUBERAY_YAMLS = sorted((CLUSTER / "kuberay").glob("*.yaml"))
VENDORED = json.loads((Path(__file__).parent / "crds" / "kuberay.json").read_text())
RAY_SCHEMA = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
# batch/v1 CronJobSpec (Kubernetes API reference, 1.27+ where timeZone is GA).
CRONJOB_SPEC = {"concurrencyPolicy", "failedJobsHistoryLimit", "jobTemplate", "schedule",
                "startingDeadlineSeconds", "successfulJobsHistoryLimit", "suspend", "timeZone"}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _pruned(validator, value, instance, schema):
    yield jsonschema.ValidationError(
        "the vendored CRD schema was pruned here (no cluster YAML used it): "
        "re-run scripts/prune_kuberay_crds.py")


# OpenAPI v3 schemas of CRDs are JSON Schema draft 4 plus Kubernetes' x- extensions.
K8sValidator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-pruned": _pruned})


def structural(node: dict) -> dict:
    """A CRD schema node -> JSON Schema with kubectl's strict field validation made explicit."""
    out = dict(node)
    if "properties" in out:
        out["properties"] = {k: structural(v) for k, v in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(out["additionalProperties"])
    if "items" in out:
        out["items"] = structural(out["items"])
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    # An object's fields are the listed ones, unless the schema keeps unknown fields or is a map.
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def crd_schema(kind: str) -> dict:
    root = structural(VENDORED["kinds"][kind])
    # metadata is ObjectMeta, which the API server validates itself (the CRD says only "object").
    root["properties"]["metadata"] = {"type": "object", "required": ["name"],
                                      "x-kubernetes-preserve-unknown-fields": True}
    root["required"] = sorted({"apiVersion", "kind", "metadata", "spec"} | set(root.get("required", [])))
    return root


def errors(schema: dict, doc: dict, validator=K8sValidator) -> list[str]:
    found = validator(schema).iter_errors(doc)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found)


KUBERAY_DOCS = [(p, d) for p in KUBERAY_YAMLS for d in docs(p) if d.get("apiVersion") == "ray.io/v1"]


@pytest.mark.parametrize("path,doc", KUBERAY_DOCS, ids=[p.name for p, _ in KUBERAY_DOCS])
def test_kuberay_documents_validate_strictly_against_the_crds(path, doc):
    assert doc["kind"] in VENDORED["kinds"], path
    assert errors(crd_schema(doc["kind"]), doc) == [], path


def test_the_kuberay_yamls_cover_every_kind_and_name_the_vendored_release():
    assert {d["kind"] for _, d in KUBERAY_DOCS} == set(VENDORED["kinds"])
    version = VENDORED["source"]["kuberay"].lstrip("v")
    for p, d in KUBERAY_DOCS:
        if d["kind"] == "RayCronJob":  # the newest fields the YAMLs use (timeZone) came in this release
            assert f"KubeRay >= {version}" in p.read_text(), p


def test_the_plain_cronjob_is_a_batch_v1_cronjob():
    found = [(p, d) for p in KUBERAY_YAMLS for d in docs(p) if d.get("kind") == "CronJob"]
    assert found
    for p, d in found:
        assert d["apiVersion"] == "batch/v1" and d["metadata"]["name"], p
        assert set(d["spec"]) <= CRONJOB_SPEC and {"schedule", "jobTemplate"} <= set(d["spec"]), p
        assert d["spec"].get("concurrencyPolicy", "Allow") in {"Allow", "Forbid", "Replace"}, p


def _cron() -> dict:
    (doc,) = [d for _, d in KUBERAY_DOCS if d["kind"] == "RayCronJob"]
    return copy.deepcopy(doc)


def test_strict_validation_rejects_unknown_fields_at_any_depth():
    cron = _cron()
    cron["spec"]["concurrencyPolicy"] = "Forbid"  # a batch/v1 CronJob field, not a RayCronJob one
    (err,) = errors(crd_schema("RayCronJob"), cron)
    assert err.startswith("spec:") and "'concurrencyPolicy' was unexpected" in err
    cron = _cron()
    head = cron["spec"]["jobTemplate"]["rayClusterSpec"]["headGroupSpec"]
    head["template"]["spec"]["containers"][0]["imagee"] = "x"  # inside the embedded pod template
    (err,) = errors(crd_schema("RayCronJob"), cron)
    assert "containers.0:" in err and "imagee" in err


def test_types_enums_required_and_int_or_string():
    cron = _cron()
    del cron["spec"]["schedule"]
    cron["spec"]["jobTemplate"]["backoffLimit"] = "0"
    limits = cron["spec"]["jobTemplate"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["resources"]["limits"]
    limits["cpu"] = 4  # a quantity is int-or-string: both forms are valid
    found = errors(crd_schema("RayCronJob"), cron)
    assert len(found) == 2
    assert any("'schedule' is a required property" in e for e in found)
    assert any(e.startswith("spec.jobTemplate.backoffLimit:") and "integer" in e for e in found)
    limits["cpu"] = "four"  # ...but a string must be a quantity
    assert any("limits.cpu" in e for e in errors(crd_schema("RayCronJob"), cron))
    mode = {"type": "string", "enum": ["K8sJobMode", "HTTPMode"]}
    enum = structural({"type": "object", "properties": {"mode": mode}})
    assert errors(enum, {"mode": "Other"}) and not errors(enum, {"mode": "K8sJobMode"})


def test_preserve_unknown_fields_and_pruned_nodes():
    kept = structural({"type": "object", "properties": {"a": {"type": "string"}},
                       "x-kubernetes-preserve-unknown-fields": True})
    assert errors(kept, {"a": "x", "anything": {"b": 1}}) == []
    assert errors(kept, {"a": 1})  # listed fields are still typed
    cron = _cron()
    cron["spec"]["jobTemplate"]["submitterPodTemplate"] = {"spec": {}}  # valid, but not vendored
    (err,) = errors(crd_schema("RayCronJob"), cron)
    assert "re-run scripts/prune_kuberay_crds.py" in err


def test_the_ray_launcher_yaml_validates_against_rays_schema():
    (d,) = docs(CLUSTER / "ray-cluster.yaml")
    validator = jsonschema.validators.validator_for(RAY_SCHEMA)
    assert errors(RAY_SCHEMA, d, validator) == []
    bad = copy.deepcopy(d)
    bad["available_node_types"]["gpu_worker"]["max_worker"] = 4
    assert any(re.search(r"'max_worker' was unexpected", e) for e in errors(RAY_SCHEMA, bad, validator))
