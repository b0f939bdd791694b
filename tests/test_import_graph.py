"""The import graph of spec_core/ and jobs/: no cycles between modules (local and
type-checking imports included: a cycle hidden inside a function is still one), and packages
import only along the intended arrows, from the models up to the jobs:

    sampling, targets  <-  fovea  <-  medusa  <-  decoding  <-  scd
    reference -> targets, sampling (never scd or decoding)  <-  scd's adapter of it
    jobs/lib -> spec_core;  a job's room jobs/_<name>/ -> jobs/lib, spec_core;
    jobs/<name>.py -> its room, jobs/lib, spec_core (no job imports another job's entry; the
    benchmark, a grid of generate runs, shares generate's room and its config and run there;
    jobs/lib never imports a job, and every module of jobs/lib serves two or more jobs)
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARROWS = {  # package -> the packages it may import
    "spec_core": set(),  # the root: a docstring
    "spec_core.sampling": set(),
    "spec_core.targets": set(),
    "spec_core.fovea": {"spec_core.targets"},
    "spec_core.medusa": {"spec_core.targets", "spec_core.fovea"},
    "spec_core.decoding": {"spec_core.targets", "spec_core.fovea", "spec_core.medusa", "spec_core.sampling"},
    "spec_core.reference": {"spec_core.targets", "spec_core.sampling"},
    "spec_core.scd": {"spec_core.decoding", "spec_core.reference", "spec_core.targets", "spec_core.sampling"},
    "jobs": set(),  # the root: empty
    "jobs.lib": {"spec_core"},
}
ROOMS = {  # job (its entry jobs/<job>.py) -> its room (jobs/_<room>/), None for a job all in its entry
    "synth_data": None,
    "build_manifests": "_build_manifests",
    "precompute": "_precompute",
    "train_drafter": "_train_drafter",
    "generate": "_generate",
    "benchmark": "_generate",  # a benchmark is a grid of generate runs: one room for both
    "generate_images": "_generate_images",
    "run_batches": "_run_batches",
}
for _job, _room in ROOMS.items():
    ARROWS[f"jobs.{_job}"] = {"jobs.lib", "spec_core"} | ({f"jobs.{_room}"} if _room else set())
    if _room:
        ARROWS[f"jobs.{_room}"] = {"jobs.lib", "spec_core"}


def modules(root: Path, packages=("spec_core", "jobs")) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a import b` names a.b when that is a
    module). A module's own enclosing packages are not edges: importing a sibling runs them
    first, but they only re-export."""
    mods = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])  # spec_core.<package>, jobs.lib, jobs.<entry>, jobs._<room>


def forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        pa = package_of(a)
        for b in sorted(targets):
            pb = package_of(b)
            allowed = ARROWS.get(pa, set())
            if pa != pb and pb not in allowed and pb.split(".")[0] not in allowed:
                out.append(f"{a} -> {b} ({pa} may import {sorted(allowed) or 'nothing of the project'})")
    return out


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph(REPO)) == []


def test_packages_import_only_along_the_intended_arrows():
    graph = import_graph(REPO)
    assert set(map(package_of, graph)) <= set(ARROWS)  # a new package states its arrows first
    assert forbidden_arrows(graph) == []


def test_jobs_lib_holds_only_what_two_or_more_jobs_share():
    graph = import_graph(REPO)
    users: dict[str, set[str]] = {m: set() for m in graph if package_of(m) == "jobs.lib" and m != "jobs.lib"}
    for job, room in ROOMS.items():
        todo = [m for m in graph if m == f"jobs.{job}" or (room and package_of(m) == f"jobs.{room}")]
        seen: set[str] = set()
        while todo:  # what the job imports from jobs/lib, directly or through other lib modules
            for dep in graph[todo.pop()]:
                if package_of(dep) == "jobs.lib" and dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        for m in seen & set(users):
            users[m].add(job)
    assert {m: sorted(j) for m, j in users.items() if len(j) < 2} == {}  # one job's code lives in its room
    entries = {p.stem for p in (REPO / "jobs").glob("*.py")} - {"__init__"}
    rooms = {p.name for p in (REPO / "jobs").iterdir() if p.name.startswith("_") and p.is_dir() and p.name != "__pycache__"}
    assert entries == set(ROOMS) and rooms == {r for r in ROOMS.values() if r}  # every job and room stated


def test_the_checks_catch_a_hidden_cycle_and_an_upward_arrow(tmp_path):
    for pkg in ("spec_core/reference", "spec_core/scd", "jobs/lib"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "spec_core/__init__.py").write_text("")
    (tmp_path / "spec_core/reference/a.py").write_text("def f():\n    from spec_core.reference.b import g\n")
    (tmp_path / "spec_core/reference/b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from spec_core.reference import a\n"
        "from spec_core.scd import x\n")
    (tmp_path / "spec_core/scd/x.py").write_text("import torch\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["spec_core.reference.a", "spec_core.reference.b"]]
    assert [f.split(" (")[0] for f in forbidden_arrows(graph)] == ["spec_core.reference.b -> spec_core.scd.x"]
