"""Build the reference world: synthetic six-task data, the target VLM and the AR image/video
generator, trained on CPU and saved in Hugging Face formats, with a quality report.

    python scripts/build_reference.py --size tiny  --out /tmp/ref-tiny
    python scripts/build_reference.py --size small --out runs/reference/small   # or s3://...
    python scripts/build_reference.py --size tiny-hires --out /tmp/ref-tiny-hires
    python scripts/build_reference.py --size hires --out runs/reference/hires   # LLaVA-NeXT, 172 visual tokens

Cached by content hash (the code of spec_core/reference, this script, size and seed): when
<out>/BUILD.json already holds the same hash, nothing is done. BUILD.json is written last.

Resumable: the build stages (data, target, generator, evaluate) run in a staging folder kept
across calls (`.<name>.build-<hash>` beside a local <out>, `<tmp>/spec-refbuild-<hash>` for s3),
each marked done with its metrics; an interrupted build (killed, out of time) continues at the
first unfinished stage on the next call - the `small` target (most of the time) is never trained
twice. The staging folder is removed once <out> is written.

Layout of <out>: data/{train,eval}.parquet, target/ (LLaVA + processor; LLaVA-NeXT for the
*-hires sizes), generator/ (codec, image_lm, video_lm; not in the hires worlds), metrics.json,
report.md, BUILD.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, UTC
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jobs.lib.storage import Storage, join, scheme_of  # noqa: E402

SIZES = ("tiny", "small", "tiny-hires", "hires")  # *-hires: the hires world (spec_core.reference.hires)
EVAL_PER_TASK = {"tiny": 2, "small": 100, "tiny-hires": 2, "hires": 100}   # the benchmark split (MMSpec: 100 per subtask)
QUALITY_PER_TASK = {"tiny": 2, "small": 50, "tiny-hires": 2, "hires": 50}  # of which this many are scored by the build


def content_hash(size: str, seed: int) -> str:
    """What the build depends on: reference-world code, this script, size, seed, torch version.

    report.py only renders metrics.json (its bars and wording): a change there re-renders
    report.md on the next call instead of rebuilding the world.
    """
    import torch

    h = hashlib.sha256(f"{size}|{seed}|torch {torch.__version__}".encode())
    code = sorted((REPO / "spec_core" / "reference").rglob("*.py"))
    files = [p for p in code if p.name != "report.py" or p.parent.name != "reference"]
    files.append(Path(__file__).resolve())
    for p in files:
        h.update(str(p.relative_to(REPO)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:20]


def is_cached(store: Storage, out: str, digest: str) -> bool:
    marker = join(out, "BUILD.json")
    return store.exists(marker) and json.loads(store.read_text(marker)).get("hash") == digest


def eval_samples(size: str, seed: int) -> list[dict]:
    from spec_core.reference import TASKS
    from spec_core.reference.vlm.build import world_of

    return [s for t in TASKS for s in world_of(size).make_split(t, EVAL_PER_TASK[size], seed, "eval")]


def write_data(stage: Path, size: str, seed: int, train: list[dict]) -> dict:
    """data/train.parquet (the target's training samples) and data/eval.parquet (held out)."""
    import pyarrow.parquet as pq

    from jobs.lib.records import samples_table

    evals = eval_samples(size, seed)
    (stage / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(samples_table(train), stage / "data" / "train.parquet")
    pq.write_table(samples_table(evals), stage / "data" / "eval.parquet")
    return {"train_samples": len(train), "eval_samples": len(evals)}


def quality_subset(evals: list[dict], size: str) -> list[dict]:
    per, seen, out = QUALITY_PER_TASK[size], {}, []
    for s in evals:
        if seen.get(s["task"], 0) < per:
            seen[s["task"]] = seen.get(s["task"], 0) + 1
            out.append(s)
    return out


DONE = ".done"  # per finished stage, <stage>/.done/<name>.json: its metrics and seconds


def build(size: str, seed: int, stage: Path) -> dict:
    """Every stage not yet done into the staging folder; returns the metrics of all of them."""
    import torch
    from tqdm.auto import tqdm

    from spec_core.reference.generator.build import GeneratorBuildConfig, build_generator, evaluate_generator
    from spec_core.reference.vlm.build import build_target, evaluate_target, train_samples

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    log = tqdm.write
    # the hires worlds are about the VLM: no image / video generator (the small world's serves SCD)
    gcfg = None if size.endswith("hires") else GeneratorBuildConfig.preset(size)

    def evaluate() -> dict:
        log("evaluating the target on held-out samples ...")
        m = evaluate_target(str(stage / "target"), quality_subset(eval_samples(size, seed), size))
        if gcfg is None:
            return m
        log("evaluating the generator ...")
        return m | evaluate_generator(str(stage / "generator"), gcfg)

    def generator() -> dict:
        import transformers

        log(f"generator: codec, image LM ({gcfg.image_lm.steps} steps)"
            + (f", video LM ({gcfg.video_lm.steps} steps)" if gcfg.video_lm is not None else "") + " ...")
        transformers.utils.logging.enable_progress_bar()  # the LM steps' bars (transformers' tqdm)
        try:
            return build_generator(gcfg, str(stage / "generator"), progress=True)
        finally:
            transformers.utils.logging.disable_progress_bar()

    memo: dict[str, list[dict]] = {}

    def train() -> list[dict]:  # rendered once per call, only if a stage needs them
        if "train" not in memo:
            memo["train"] = train_samples(size, seed)
        return memo["train"]

    steps = {
        "data": lambda: write_data(stage, size, seed, train()),
        "target": lambda: build_target(size, str(stage / "target"), seed, train(), log=log, progress=tqdm),
        "generator": generator,
        "evaluate": evaluate,
    }
    if gcfg is None:
        del steps["generator"]
    metrics: dict = {"size": size, "seed": seed}
    stages: dict[str, float] = {}
    (stage / DONE).mkdir(parents=True, exist_ok=True)
    for name, run in steps.items():
        marker = stage / DONE / f"{name}.json"
        if marker.is_file():
            done = json.loads(marker.read_text())
            log(f"stage {name}: done in an earlier call ({done['seconds']:.0f}s), kept")
        else:
            shutil.rmtree(stage / name, ignore_errors=True)  # what a killed call left half-written
            t = time.perf_counter()
            done = {"metrics": run(), "seconds": round(time.perf_counter() - t, 1)}
            marker.write_text(json.dumps(done))
        metrics.update(done["metrics"])
        stages[name] = done["seconds"]
    metrics["stage_seconds"] = stages
    metrics["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    return metrics


def staging_dir(out: str, digest: str, local_parent: str | None) -> Path:
    """Where a build of `digest` for `out` stages its files, the same on every call; staging
    folders of other hashes for the same <out> (stale code) are removed."""
    if local_parent:
        parent, name = Path(local_parent).parent, Path(local_parent).name
        parent.mkdir(parents=True, exist_ok=True)
        for old in parent.glob(f".{name}.build-*"):
            if old.name != f".{name}.build-{digest}":
                shutil.rmtree(old, ignore_errors=True)
        return parent / f".{name}.build-{digest}"
    return Path(tempfile.gettempdir()) / f"spec-refbuild-{digest}"


def upload(store: Storage, stage: Path, out: str) -> list[str]:
    files = sorted(p for p in stage.rglob("*") if p.is_file() and DONE not in p.relative_to(stage).parts)
    for p in files:
        store.write_bytes(join(out, *p.relative_to(stage).parts), p.read_bytes())
    return [str(p.relative_to(stage)) for p in files]


def main(argv: list[str] | None = None) -> dict:
    import warnings

    import transformers

    from spec_core.reference.report import render_report

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=SIZES, required=True)
    ap.add_argument("--out", required=True, help="storage URI (local path or s3://...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even when the cache matches")
    ap.add_argument("--check", action="store_true", help="only say whether the build is cached (exit 0) or not (1)")
    args = ap.parse_args(argv)
    store, digest = Storage(), content_hash(args.size, args.seed)
    if args.check:
        cached = is_cached(store, args.out, digest)
        print(f"reference world '{args.size}' at {args.out}: {'cached' if cached else 'to be built'}")
        raise SystemExit(0 if cached else 1)
    if not args.force and is_cached(store, args.out, digest):
        print(f"reference world '{args.size}' is up to date at {args.out} (hash {digest}): nothing to do")
        metrics = json.loads(store.read_text(join(args.out, "metrics.json")))
        report, report_uri = render_report(metrics), join(args.out, "report.md")
        if not store.exists(report_uri) or store.read_text(report_uri) != report:
            store.write_text(report_uri, report)    # the bars or wording changed, not the world
        return metrics
    local_parent = args.out if scheme_of(args.out) == "file" and "://" not in args.out else None
    stage = staging_dir(args.out, digest, local_parent)
    if args.force:
        shutil.rmtree(stage, ignore_errors=True)
    metrics = build(args.size, args.seed, stage)
    metrics["build_seconds"] = round(sum(metrics["stage_seconds"].values()), 1)  # over every call
    metrics["hash"] = digest
    (stage / "metrics.json").write_text(json.dumps(metrics, indent=2))
    (stage / "report.md").write_text(render_report(metrics))
    store.delete(join(args.out, "BUILD.json"))
    files = upload(store, stage, args.out)
    shutil.rmtree(stage, ignore_errors=True)
    build_info = {"hash": digest, "size": args.size, "seed": args.seed, "files": files,
                  "created_utc": datetime.now(UTC).isoformat()}
    store.write_text(join(args.out, "BUILD.json"), json.dumps(build_info, indent=2))
    print(f"reference world '{args.size}' built in {metrics['build_seconds']:.0f}s -> {args.out}")
    print(render_report(metrics))
    return metrics


if __name__ == "__main__":
    main()
