"""Offline image / video generation batches with lossless Speculative Jacobi / Coupled Decoding, on a
Ray actor pool.

    python jobs/generate_images.py --config manifests/jobs/generate_images.yaml [--set compute.num_actors=4]
    ray job submit --working-dir . -- python jobs/generate_images.py --config manifests/jobs/generate_images.yaml

prompt manifest (JSONL or Parquet: id, prompt, kind image | video; optional background and colour
for a prompt-following score) -> shards -> actor pool (one generator per actor; num_gpus and
num_cpus per actor from the config) -> every prompt with every method (ar, sjd, scd_mc, scd_gs) at
every window L (an integer, or auto: L chosen per iteration for tokens per second, up to
windows.auto_max) and seed -> <run>/media/<method>_L<L>/<id>_s<seed>.png|gif and one record per item
under <run>/items/ (a rerun skips the items already there), rejects with their reasons under
<run>/rejects/. At the end: items.parquet, rejects.parquet, metrics.json, report.md (NFE and
latency acceleration against AR, SJD / SCD, peak memory, quality against AR's own seed-to-seed
noise), nfe_vs_window.png, acceptance.png and sample grids.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import ClassVar, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

from pydantic import Field, model_validator  # noqa: E402

from jobs.lib.config import Strict  # noqa: E402
from jobs.lib.job import DecodeComputeSection, JobConfig, run_job  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.model_cache import read_model_file  # noqa: E402
from jobs.lib.ray_setup import init_ray  # noqa: E402
from jobs.lib.run_key import fingerprint, open_run  # noqa: E402
from jobs.lib.storage import Storage, join, scheme_of  # noqa: E402

Method = Literal["ar", "sjd", "scd_mc", "scd_gs"]


class DataSection(Strict):
    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"shard_size"})  # items are committed one by one

    prompts: str = Field("manifests/prompts/reference.jsonl",
                         description="a prompt manifest (.jsonl or .parquet: id, prompt, kind), any URI")
    limit_per_kind: int | None = Field(None, ge=1, description="N image prompts and N video prompts: a seeded "
                                       "sample per kind (jobs.lib.subset), not the first N")
    seed: int = Field(0, description="seed of the `limit_per_kind` sample")
    shard_size: int = Field(8, ge=1, description="prompts per actor call")


class GeneratorSection(Strict):
    path: str = Field("runs/reference/small/generator", description="a generator directory: a local path, or any "
                      "storage URI (s3://: downloaded once per node, jobs.lib.model_cache)")


class SamplingSection(Strict):
    """The verified distribution (the same for every method: lossless). null: the generator's default."""

    temperature: float | None = Field(None, gt=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    cfg_scale: float | None = Field(None, gt=0)


class AutoMaxSection(Strict):
    image: int = Field(64, ge=2, description="the largest L window auto may choose for images")
    video: int = Field(128, ge=2, description="... for videos")


class WindowsSection(Strict):
    """Jacobi windows per kind: integers >= 2, and auto (scd.window: L per iteration in
    [1, auto_max] maximising committed tokens per second on the running hardware, per actor:
    raced on calibration_prompts of its prompts, then locked)."""

    image: list[int | Literal["auto"]] = Field([16, 32, 64, "auto"], min_length=1)
    video: list[int | Literal["auto"]] = Field([32, 64, 128, "auto"], min_length=1)
    auto_max: AutoMaxSection = AutoMaxSection()
    calibration_prompts: int = Field(8, ge=1, description="auto: at most this many batches of prompts "
                                     "(batch_size each) on which each actor races the windows that could "
                                     "win, untimed, before locking the fastest (fewer when one is clear)")

    @model_validator(mode="after")
    def _sizes(self):
        for kind, ws in (("image", self.image), ("video", self.video)):
            if any(w != "auto" and w < 2 for w in ws) or len(set(ws)) != len(ws):
                raise ValueError(f"windows.{kind} must be distinct integers >= 2 (window 1 is AR) or auto")
        return self


class ComputeSection(DecodeComputeSection):
    batch_size: int = Field(1, ge=1, description="prompts decoded together (1: the papers' latency protocol)")


class GenerateImagesConfig(JobConfig):
    data: DataSection = DataSection()
    generator: GeneratorSection = GeneratorSection()
    sampling: SamplingSection = SamplingSection()
    methods: list[Method] = Field(["ar", "sjd", "scd_mc", "scd_gs"], min_length=1)
    windows: WindowsSection = WindowsSection()
    alpha: float = Field(1.0, ge=0, le=1, description="coupling strength of scd_* (SCD Eq. 4)")
    seeds: list[int] = Field([0], min_length=1)
    ar_extra_seeds: list[int] = Field([1], description="AR at these seeds too: the quality noise floor")
    compute: ComputeSection = ComputeSection()

    @model_validator(mode="after")
    def _methods(self):
        if "ar" not in self.methods:
            raise ValueError("methods must include ar: every acceleration is measured against it")
        if len(set(self.methods)) != len(self.methods) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("methods and seeds must not repeat")
        if set(self.ar_extra_seeds) & set(self.seeds):
            raise ValueError("ar_extra_seeds must differ from seeds")
        return self


def read_prompts(store: Storage, uri: str, limit_per_kind: int | None, seed: int = 0) -> list[dict]:
    """Manifest rows; a missing file, a missing id/prompt column or a repeated id fails first."""
    if not store.exists(uri):
        raise FileNotFoundError(f"prompt manifest {uri} does not exist")
    if uri.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(io.BytesIO(store.read_bytes(uri))).to_pylist()
    else:
        rows = [json.loads(line) for line in store.read_text(uri).splitlines() if line.strip()]
    if limit_per_kind:
        from jobs.lib.subset import stratified_rows

        kinds = [r.get("kind") or "image" for r in rows]
        keep: list[int] = []
        for k in set(kinds):  # limit_per_kind of each kind, drawn at random, kept in file order
            mine = [i for i, kind in enumerate(kinds) if kind == k]
            keep += [mine[j] for j in stratified_rows([k] * len(mine), limit_per_kind, seed)]
        rows = [rows[i] for i in sorted(keep)]
    if not rows:
        raise ValueError(f"prompt manifest {uri} has no rows")
    if any("id" not in r or "prompt" not in r for r in rows):
        raise ValueError(f"prompt manifest {uri}: every row needs 'id' and 'prompt'")
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"prompt manifest {uri}: ids repeat ({sorted({i for i in ids if ids.count(i) > 1})[:5]})")
    return [{**r, "id": str(r["id"])} for r in rows]


def main(cfg: GenerateImagesConfig) -> dict:
    import ray

    from jobs._generate_images.worker import ImagePlan, ImageWorker

    store = Storage(cfg.storage)
    run_dir = cfg.run_dir("generate_images")
    rows = read_prompts(store, cfg.data.prompts, cfg.data.limit_per_kind, cfg.data.seed)
    if read_model_file(store, cfg.generator.path, "generator_config.json") is None:  # s3://: this file only
        where = "local " if scheme_of(cfg.generator.path) == "file" else ""
        raise FileNotFoundError(f"{cfg.generator.path} is not a {where}generator directory "
                                "(build one: python scripts/build_reference.py)")
    key = open_run(cfg, "generate_images", store, {"generator": fingerprint(store, cfg.generator.path),
                                                   "prompts": fingerprint(store, cfg.data.prompts)})
    rec = RunRecorder("generate_images", cfg, run_dir, store)
    shards = [{"shard": i, "rows": rows[s:s + cfg.data.shard_size]}
              for i, s in enumerate(range(0, len(rows), cfg.data.shard_size))]
    plan = ImagePlan(tuple(cfg.methods), {"image": tuple(cfg.windows.image), "video": tuple(cfg.windows.video)},
                     tuple(cfg.seeds), tuple(cfg.ar_extra_seeds), cfg.sampling.model_dump(), cfg.alpha,
                     cfg.compute.batch_size, cfg.windows.auto_max.model_dump(), cfg.windows.calibration_prompts)
    rec.figure("ray", init_ray(cfg.ray)["mode"])
    local = str(Path(cfg.generator.path).resolve()) if scheme_of(cfg.generator.path) == "file" else cfg.generator.path
    with rec.stage("generate") as st:
        Actor = ray.remote(ImageWorker).options(num_gpus=cfg.compute.num_gpus_per_actor,
                                                num_cpus=cfg.compute.num_cpus_per_actor,
                                                max_restarts=3, max_task_retries=3, scheduling_strategy="SPREAD")
        actors = [Actor.remote(local, cfg.storage, run_dir, plan, cpu_threads=max(1, int(cfg.compute.num_cpus_per_actor)),
                               metadata={"config_hash": key["hash"]}, compile=cfg.compute.compile,
                               compile_cache=cfg.compute.compile_cache)
                  for _ in range(min(cfg.compute.num_actors, len(shards)))]
        pool = ray.util.ActorPool(actors)
        new = 0
        for r in rec.progress(pool.map_unordered(lambda a, s: a.__call__.remote(s), shards),
                              total=len(shards), desc="shards"):
            new += r["items"]
        for a in actors:
            ray.kill(a)
        st["items"] = new
    return finish(rec, store, run_dir)


def _read_all(store: Storage, uri: str) -> list[dict]:
    return [json.loads(store.read_text(join(uri, n))) for n in sorted(store.list(uri)) if n.endswith(".json")]


def finish(rec: RunRecorder, store: Storage, run_dir: str) -> dict:
    """Aggregate the item records into tables, metrics.json, report.md, plots and grids."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from jobs._generate_images import report as ir
    from jobs.lib.metrics import actor_device

    items, rejects = _read_all(store, join(run_dir, "items")), _read_all(store, join(run_dir, "rejects"))
    # window: 16, 32, ... or "auto" in a record; a string column in items.parquet
    for name, table in (("items", [{**r, "window": str(r["window"])} for r in items]), ("rejects", rejects)):
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(table) if table else pa.table({}), buf)
        store.write_bytes(join(run_dir, f"{name}.parquet"), buf.getvalue())
    tables = {k: ir.accel_table(items, k) for k in ir.KINDS}
    quality = {k: ir.quality_table(items, k) for k in ir.KINDS}
    curves = {k: ir.acceptance_curves(items, k) for k in ir.KINDS}
    ar_stats = {}
    for kind in ir.KINDS:
        ar_all = [r for r in items if r["kind"] == kind and r["method"] == "ar"]
        ar = [r for r in ar_all if r["seed"] == min(x["seed"] for x in ar_all)]
        if ar:
            ar_stats[kind] = {"samples": len(ar), "tokens": ar[0]["tokens"], "nfe": sum(r["nfe"] for r in ar) / len(ar),
                              "latency_s": sum(r["latency_s"] for r in ar) / len(ar),
                              "entropy": sum(r["entropy"] for r in ar) / len(ar)}
    plots, grids = [], []
    if any(tables[k] for k in ar_stats):
        store.write_bytes(join(run_dir, "nfe_vs_window.png"),
                          ir.nfe_plot_png({k: tables[k] for k in ar_stats}, {k: v["nfe"] for k, v in ar_stats.items()}))
        store.write_bytes(join(run_dir, "acceptance.png"), ir.curves_plot_png(curves))
        plots = ["nfe_vs_window.png", "acceptance.png"]
    for kind in ar_stats:
        grid = _grid_rows(store, run_dir, items, kind, Image)
        if grid:
            store.write_bytes(join(run_dir, f"grid_{kind}.png"), ir.grid_png(grid))
            grids.append(f"grid_{kind}.png")
    rec.count("items", len(items))
    rec.count("rejects", len(rejects))
    for kind, rows in tables.items():  # per kind and method: {window: acceleration}
        for m in dict.fromkeys(r["method"] for r in rows if r["method"] != "ar"):
            mine = [r for r in rows if r["method"] == m]
            rec.figure(f"{kind}_{m}_nfe_accel", {str(r["window"]): round(r["nfe_accel"], 2) for r in mine})
            rec.figure(f"{kind}_{m}_latency_accel",
                       {str(r["window"]): round(r["latency_accel"], 2) if r["latency_accel"] else None for r in mine})
            auto = [r for r in mine if r["window"] == "auto"]
            if auto:  # the L window auto settled on (mean over iterations)
                rec.figure(f"{kind}_{m}_auto_mean_window", round(auto[0]["mean_window"], 1))
    rec.detail("acceleration", tables)
    rec.detail("quality", quality)
    rec.detail("ar", ar_stats)
    rec.detail("acceptance_curves", curves)
    rec.figure("rejects", [f"{r['id']}: {r['reason']}" for r in rejects][:20])
    rec.figure("run_dir", run_dir)
    c = rec.cfg.compute  # cost: the timed batches (an item's e2e_s is its batch's)
    kind, per_actor = actor_device(c.num_gpus_per_actor, c.num_cpus_per_actor)
    n_shards = -(-len({r["id"] for r in items + rejects}) // rec.cfg.data.shard_size)
    rec.device_time("generate", sum(r["e2e_s"] / r["batch_size"] for r in items), per_actor, kind,
                    actors=min(c.num_actors, n_shards), samples=len(items), tokens=sum(r["tokens"] for r in items),
                    note="busy: the timed batches of every item in the run directory (warm-ups excluded)")
    return rec.finish(ir.render(tables, quality, ar_stats, plots, grids))


def _grid_rows(store: Storage, run_dir: str, items: list[dict], kind: str, Image) -> list[tuple[str, list]]:
    """AR and every method at its largest window, on the first prompts (images: 8 prompts; videos:
    the 8 frames of the first prompt)."""
    seed = min(r["seed"] for r in items if r["kind"] == kind)
    mine = [r for r in items if r["kind"] == kind and r["seed"] == seed]
    ids = sorted({r["id"] for r in mine})[: (8 if kind == "image" else 1)]
    out = []
    for m in ("ar", "sjd", "scd_mc", "scd_gs"):
        recs = [r for r in mine if r["method"] == m]
        if not recs:
            continue
        fixed = [r["window"] for r in recs if r["window"] != "auto"]
        w = max(fixed) if fixed else "auto"
        by_id = {r["id"]: r for r in recs if r["window"] == w}
        if not all(i in by_id for i in ids):
            continue
        ims = []
        for i in ids:
            im = Image.open(io.BytesIO(store.read_bytes(join(run_dir, by_id[i]["media"]))))
            if kind == "video":
                for f in range(getattr(im, "n_frames", 1)):
                    im.seek(f)
                    ims.append(im.convert("RGB"))
            else:
                ims.append(im.convert("RGB"))
        out.append((m if m == "ar" else f"{m} L={w}", ims))
    return out


def summary(cfg: GenerateImagesConfig, m: dict) -> list[str]:
    f, lines = m["figures"], []
    for k, v in f.items():
        if k.endswith("_nfe_accel"):
            auto = f.get(k[:-10] + "_auto_mean_window")
            lines.append(f"{k[:-10]}: NFE / latency acceleration per window "
                         f"{ {w: (x, f[k[:-10] + '_latency_accel'][w]) for w, x in v.items()} }"
                         + (f" (auto: mean L {auto})" if auto is not None else ""))
    return lines + [f"{m['counts'].get('items', 0)} items, {m['counts'].get('rejects', 0)} rejects -> {f['run_dir']}"]


if __name__ == "__main__":  # an unreadable manifest or generator, or unreachable storage: one line, exit 1
    run_job("generate_images", summary, FileNotFoundError, PermissionError, ConnectionError, ValueError)
