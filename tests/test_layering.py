"""The layering rule: spec_core is pure torch + transformers + numpy (+ Pillow, tokenizers,
safetensors for the reference world); it never imports Ray, DeepSpeed, storage clients,
pydantic, YAML or anything under jobs/."""

import ast
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {"spec_core", "torch", "transformers", "numpy", "PIL", "tokenizers", "safetensors"}
FORBIDDEN = {"ray", "deepspeed", "s3fs", "boto3", "botocore", "fsspec", "pydantic", "yaml",
             "pyarrow", "datasets", "jobs", "scripts", "tests"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def violations(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for mod in sorted(imported_roots(path)):
            if mod in FORBIDDEN or (mod not in ALLOWED and mod not in sys.stdlib_module_names):
                out.append(f"{path.relative_to(root.parent)} imports {mod}")
    return out


def test_spec_core_imports_only_the_algorithm_stack():
    assert (REPO / "spec_core").is_dir()
    assert violations(REPO / "spec_core") == []


def test_checker_catches_a_violation(tmp_path):
    pkg = tmp_path / "spec_core"
    pkg.mkdir()
    (pkg / "bad.py").write_text("import torch\nfrom ray.data import Dataset\nimport json\n")
    assert violations(pkg) == ["spec_core/bad.py imports ray"]


def test_importing_spec_core_loads_no_ray():
    code = "import spec_core, spec_core.reference, sys; assert 'ray' not in sys.modules; " \
           "assert 'pydantic' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def cluster_entrypoints(text: str) -> list[str]:
    """Every `jobs/<name>.py` a cluster YAML names (entrypoints, commands, args)."""
    import re

    found = []
    for doc in yaml.safe_load_all(text):
        found += re.findall(r"jobs/[A-Za-z0-9_]+\.py", yaml.safe_dump(doc))
    return found


def missing_entrypoints(paths: list[Path]) -> list[str]:
    return [f"{p.name}: {e}" for p in paths for e in cluster_entrypoints(p.read_text())
            if not (REPO / e).is_file()]


def test_cluster_yamls_name_existing_jobs():
    assert missing_entrypoints(sorted((REPO / "cluster").glob("*.yaml"))) == []


def test_cluster_checker_catches_a_missing_job(tmp_path):
    y = tmp_path / "job.yaml"
    y.write_text("kind: RayJob\nspec:\n  entrypoint: python jobs/nope.py --config x\n"
                 "---\nentrypoint: python jobs/synth_data.py\n")
    assert missing_entrypoints([y]) == ["job.yaml: jobs/nope.py"]
