"""Prune KubeRay's CRDs to the schema facts tests/cluster/test_crd_schemas.py needs.

The CRDs embed whole PodTemplateSpecs (~0.8-1.4 MB each). This keeps, for every schema node that a
document under cluster/kuberay/ reaches, the node's validation keywords and ALL its property names
(so an unknown field is still an unknown field), and replaces each sub-schema no document enters by
{"x-pruned": true}: the test fails there ("re-run this script") instead of guessing. Nothing is
replaced by x-kubernetes-preserve-unknown-fields: a custom resource's embedded pod template is
checked by the API server only against the CRD's own copy of the PodSpec schema, so we keep it.
Dropped: descriptions, defaults, formats, list/map merge hints and CEL rules (x-kubernetes-validations,
which only the API server evaluates).

    git clone --depth 1 --branch v1.7.0 https://github.com/ray-project/kuberay /tmp/kuberay
    python scripts/prune_kuberay_crds.py /tmp/kuberay/ray-operator/config/crd/bases --version v1.7.0
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml",
             "RayCronJob": "ray.io_raycronjobs.yaml"}
KEEP = {"type", "enum", "required", "nullable", "anyOf", "pattern", "minimum", "maximum", "minLength",
        "maxLength", "minItems", "maxItems", "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields"}
PRUNED = {"x-pruned": True}


def prune(schema: dict, values: list) -> dict:
    """`schema` restricted to what `values` (all instances that reach this node) enter."""
    if not values:
        return dict(PRUNED)
    out = {k: v for k, v in schema.items() if k in KEEP}
    maps = [v for v in values if isinstance(v, dict)]
    if "properties" in schema:
        out["properties"] = {name: prune(sub, [m[name] for m in maps if name in m])
                             for name, sub in schema["properties"].items()}
    if isinstance(schema.get("additionalProperties"), dict):
        known = schema.get("properties", {})
        extra = [v for m in maps for k, v in m.items() if k not in known]
        out["additionalProperties"] = prune(schema["additionalProperties"], extra)
    elif "additionalProperties" in schema:
        out["additionalProperties"] = schema["additionalProperties"]
    if "items" in schema:
        out["items"] = prune(schema["items"], [x for v in values if isinstance(v, list) for x in v])
    return out


def served_v1(crd: dict) -> dict:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bases", type=Path, help="kuberay's ray-operator/config/crd/bases")
    parser.add_argument("--version", required=True, help="the KubeRay tag the files come from")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "cluster" / "crds" / "kuberay.json")
    args = parser.parse_args()
    docs = [d for p in sorted((REPO / "cluster" / "kuberay").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]
    kinds, sources = {}, {}
    for kind, name in CRD_FILES.items():
        raw = (args.bases / name).read_bytes()
        kinds[kind] = prune(served_v1(yaml.safe_load(raw)), [d for d in docs if d.get("kind") == kind])
        sources[name] = hashlib.sha256(raw).hexdigest()
    meta = {"kuberay": args.version, "sha256": sources, "made_by": "scripts/prune_kuberay_crds.py"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"source": meta, "kinds": kinds}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
