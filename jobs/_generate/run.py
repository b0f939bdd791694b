"""The generate job's config and run (`jobs/generate.py` is its entry): shared with
`jobs/benchmark.py`, whose settings are generate runs over the method zoo. What it does: see
jobs/generate.py."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from jobs.lib.artifact_store import committed_shards, read_kind, verified_shards
from jobs.lib.config import Strict
from jobs.lib.job import DecodeComputeSection, JobConfig
from jobs.lib.manifest_rows import check_manifest
from jobs.lib.metrics import RunRecorder
from jobs.lib.model_cache import model_identity, model_position_limit, read_model_file
from jobs.lib.ray_setup import init_ray
from jobs.lib.run_key import fingerprint, open_run
from jobs.lib.storage import Storage, join, scheme_of


class DataSection(Strict):
    manifest: str = Field("runs/build_manifests/reference/eval",
                          description="an evaluation manifest (Parquet) or a folder of them, any URI")
    limit_per_source: int | None = Field(None, ge=1, description="N rows of each manifest file: a seeded "
                                         "sample stratified by task (jobs.lib.subset), not the first N")
    seed: int = Field(0, description="seed of the `limit_per_source` sample")
    max_length: int = Field(2048, ge=8, description="longer prompts are rejected")
    shard_size: int = Field(16, ge=1, description="samples per committed shard (and per throughput stream)")


class TargetSection(Strict):
    path: str = Field("runs/reference/small/target", description="a model directory: a local path, or any "
                      "storage URI (s3://: downloaded once per node, jobs.lib.model_cache)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU


class TreeSection(Strict):
    width: int = Field(6, ge=1, description="K_c: children per expanded node")
    depth: int = Field(6, ge=1, description="D: longest draft path")
    budget: int = Field(40, ge=1, description="draft nodes verified per step")
    step_tokens: int = Field(0, ge=0, description="> 0: at most this many tokens verified per step over "
                             "the batch; trees shrink as more samples share a step (TreeConfig.for_batch)")
    policy: Literal["fixed", "goodput"] = Field("fixed", description="fixed: the budget every step; goodput: per "
                                                "step, the draft depth and node count (up to depth and budget) that "
                                                "maximise expected tokens per second on this hardware, AR where "
                                                "speculation cannot pay (spec_core.decoding.goodput)")


# methods with a trained drafter: kind -> the saved directory's format tag
TRAINED = {"fovea": "fovea-drafter/1", "medusa": "medusa-heads/1"}


class MethodSection(Strict):
    kind: Literal["ar", "hf", "fovea", "medusa", "pld", "sam", "lookahead", "recycling"] = "fovea"
    drafter: str | None = Field(None, description="a saved drafter directory: the FOVEA feature-drafter "
                                "family (kind fovea) or Medusa heads (kind medusa), from train_drafter")
    params: dict = Field(default_factory=dict, description="a training-free method's parameters "
                         "(MMSpec Table 6 defaults: pld ngram 4 n_pred 10; sam max_len 10; lookahead "
                         "decoding_length 64 branch_length 12; recycling k 8)")
    viskip: float | None = Field(None, ge=0, description="ViSkip: no draft when the state's last-layer "
                                 "attention share on the image is >= this (MMSpec: 0.35)")
    visual_correction: bool = Field(True, description="false: score drafts without the visual memory")
    correction_depth: int | None = Field(None, ge=0, description="correct draft states at depths <= this; "
                                         "null: the drafter's trained value")
    compile: bool | None = Field(None, description="this method's decode steps compiled (kind hf: HF's static cache "
                                 "and compiled decode) or eager; null: compute.compile. ViSkip and track_visual "
                                 "decode eagerly")
    tree: TreeSection = TreeSection()

    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"compile"})  # the same outputs either way

    @model_validator(mode="after")
    def _drafter_matches_kind(self):
        if self.kind in TRAINED and not self.drafter:
            raise ValueError(f"a {self.kind} method needs a drafter directory")
        if self.kind not in TRAINED and self.drafter:
            raise ValueError(f"a {self.kind} method takes no drafter")
        if self.params and self.kind in ("ar", "hf", *TRAINED):
            raise ValueError("params are for training-free methods (pld, sam, lookahead, recycling)")
        if self.kind == "hf" and self.viskip is not None:
            raise ValueError("an hf method (HF generate itself) takes no viskip")
        return self


class GenerationSection(Strict):
    max_new_tokens: int = Field(256, ge=1)
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = 0
    track_visual: bool = Field(False, description="record each batch-1 step's last-layer attention share on "
                               "the image (MMSpec Table 7); one extra eager attention per step")


class ComputeSection(DecodeComputeSection):
    batch_sizes: list[int] = Field([1, 4, 16], min_length=1, description="throughput is measured at each")

    @model_validator(mode="after")
    def _batches(self):
        if any(b < 1 for b in self.batch_sizes) or len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError("batch_sizes must be distinct integers >= 1")
        return self


def _default_methods() -> dict[str, MethodSection]:
    return {"ar": MethodSection(kind="ar"),
            "fovea": MethodSection(drafter="runs/train_drafter/reference/drafter")}


class GenerateConfig(JobConfig):
    data: DataSection = DataSection()
    target: TargetSection = TargetSection()
    generation: GenerationSection = GenerationSection()
    compute: ComputeSection = ComputeSection()
    methods: dict[str, MethodSection] = Field(default_factory=_default_methods)
    compare: list[str] = Field(["ar", "fovea"], min_length=1,
                               description="methods to run; the first is the baseline of every ratio")

    @model_validator(mode="after")
    def _compare_known(self):
        unknown = [m for m in self.compare if m not in self.methods]
        if unknown:
            raise ValueError(f"compare names {unknown}, not in methods {sorted(self.methods)}")
        if len(set(self.compare)) != len(self.compare):
            raise ValueError("compare lists a method twice")
        return self

    def computing(self) -> GenerateConfig:
        """Only the compared methods determine the outputs."""
        return self.model_copy(update={"methods": {n: self.methods[n] for n in self.compare}})


def manifest_files(store: Storage, uri: str) -> list[str]:
    """A Parquet file, or every *.parquet directly in a folder (sorted)."""
    if uri.endswith(".parquet"):
        if not store.exists(uri):
            raise FileNotFoundError(f"manifest {uri} does not exist")
        return [uri]
    files = [join(uri, n) for n in store.list(uri) if n.endswith(".parquet")]
    if not files:
        raise FileNotFoundError(f"no manifest: {uri} is neither a .parquet file nor a folder holding some")
    return files


def plan_shards(store: Storage, files: list[str], limit: int | None, shard_size: int, seed: int = 0) -> list[dict]:
    """Deterministic shards: each file's rows (all, or a stratified sample of `limit`) in order,
    `shard_size` at a time."""
    import pyarrow.parquet as pq

    from jobs.lib.subset import stratified_rows

    shards = []
    for uri in files:
        fs, path = store.arrow_fs(uri)
        tasks = pq.read_table(path, filesystem=fs, columns=["task"]).column(0).to_pylist()
        rows = stratified_rows(tasks, limit, seed)
        for start in range(0, len(rows), shard_size):
            shards.append({"shard": len(shards), "manifest": uri, "rows": rows[start: start + shard_size]})
    return shards


def _budget(m: MethodSection) -> int:
    """A training-free method's tree budget: its own draft size unless the tree sets one."""
    from spec_core.decoding.proposers import DEFAULT_BUDGET

    if m.kind in DEFAULT_BUDGET and "budget" not in m.tree.model_fields_set:
        return DEFAULT_BUDGET[m.kind]
    return m.tree.budget


def check_drafters(cfg: GenerateConfig, ident: dict, store: Storage | None = None) -> None:
    """Every compared drafter is a directory (local or any URI) of its kind's format, for a target
    of these sizes; only its config.json is read."""
    from spec_core.targets.saved import check_meta

    store = store or Storage(cfg.storage)
    for name in cfg.compare:
        m = cfg.methods[name]
        if m.drafter is None:
            continue
        raw = read_model_file(store, m.drafter, "config.json")
        if raw is None:
            where = "local " if scheme_of(m.drafter) == "file" else ""
            raise FileNotFoundError(f"method {name}: drafter {m.drafter} is not a {where}drafter directory")
        try:
            check_meta(json.loads(raw), TRAINED[m.kind], f"{m.kind} drafter", m.drafter,
                       {k: ident.get(k) for k in ("hidden_size", "vocab_size")})
        except ValueError as e:
            raise ValueError(f"method {name}: {e}") from None


def main(cfg: GenerateConfig) -> dict:
    import ray

    from jobs._generate.worker import KINDS, GenerateWorker, MethodPlan

    store = Storage(cfg.storage)
    run_dir = cfg.run_dir("generate")
    root = join(run_dir, "shards")
    try:
        files = manifest_files(store, cfg.data.manifest)
    except (FileNotFoundError, PermissionError):
        raise
    except Exception as err:  # noqa: BLE001 - storage clients raise their own types
        raise ConnectionError(f"cannot reach the manifest's storage: {err}") from err
    for uri in files:  # from the footers: columns and rows, before Ray starts
        check_manifest(store, uri, ("id", "task", "conversation"))
    ident = model_identity(store, cfg.target.path)  # s3://: its config.json only; actors download the rest
    check_drafters(cfg, ident, store)
    limit = model_position_limit(store, cfg.target.path)
    if limit is not None and cfg.generation.max_new_tokens >= limit:  # every turn would be rejected
        raise ValueError(f"generation.max_new_tokens {cfg.generation.max_new_tokens} leaves no position for a prompt: "
                         f"the target has {limit} (max_position_embeddings), and a turn is rejected where its prompt "
                         f"plus max_new_tokens do not fit - set it below {limit} less the longest prompt")
    inputs = {"target": fingerprint(store, cfg.target.path), **{f"manifest {u}": fingerprint(store, u) for u in files},
              **{f"drafter {n}": fingerprint(store, cfg.methods[n].drafter) for n in cfg.compare if cfg.methods[n].drafter}}
    key = open_run(cfg, "generate", store, inputs)
    rec = RunRecorder("generate", cfg, run_dir, store)
    shards = plan_shards(store, files, cfg.data.limit_per_source, cfg.data.shard_size, cfg.data.seed)
    done = verified_shards(store, root, committed_shards(store, root, key["hash"], shards),
                           lambda line: print(f"generate: {line}", flush=True))
    pending = [s for s in shards if s["shard"] not in done]
    rec.figure("ray", init_ray(cfg.ray)["mode"])
    local = lambda p: str(Path(p).resolve()) if scheme_of(p) == "file" else p  # noqa: E731
    plans = [MethodPlan(name, local(m.drafter) if m.drafter else None, m.visual_correction,
                        m.tree.width, m.tree.depth, _budget(m), m.tree.step_tokens, m.correction_depth,
                        m.kind if m.kind not in ("ar", "hf", *TRAINED) else None, dict(m.params), m.viskip,
                        hf=m.kind == "hf", policy=m.tree.policy, compile=m.compile)
             for name, m in ((n, cfg.methods[n]) for n in cfg.compare)]
    gen = cfg.generation
    with rec.stage("generate") as st:
        if pending:
            n_actors = min(cfg.compute.num_actors, len(pending))
            # an actor whose node is lost is restarted elsewhere and its call retried (shards are
            # committed once: a retry of a committed shard returns its marker)
            Actor = ray.remote(GenerateWorker).options(num_gpus=cfg.compute.num_gpus_per_actor,
                                                       num_cpus=cfg.compute.num_cpus_per_actor,
                                                       max_restarts=3, max_task_retries=3, scheduling_strategy="SPREAD")
            actors = [Actor.remote(
                local(cfg.target.path), {**ident, "target_path": cfg.target.path}, plans, cfg.storage, root,
                dtype=cfg.target.dtype, max_length=cfg.data.max_length, max_new_tokens=gen.max_new_tokens,
                batch_sizes=tuple(cfg.compute.batch_sizes), seed=gen.seed,
                sampling=dict(do_sample=gen.do_sample, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p),
                cpu_threads=max(1, int(cfg.compute.num_cpus_per_actor)), track_visual=gen.track_visual,
                compile=cfg.compute.compile, compile_cache=cfg.compute.compile_cache,
                metadata={"config_hash": key["hash"], **ident}) for _ in range(n_actors)]
            pool = ray.util.ActorPool(actors)
            for _ in rec.progress(pool.map_unordered(lambda a, s: a.__call__.remote(s), pending),
                                  total=len(pending), desc="shards"):
                pass  # each result is a committed shard's marker, read back below
            for a in actors:
                ray.kill(a)
        st["items"] = len(pending)
    done = committed_shards(store, root, key["hash"], shards)
    missing = [s["shard"] for s in shards if s["shard"] not in done]
    if missing:
        raise RuntimeError(f"{len(missing)} shards not committed: {missing[:10]}")
    tables = {k: read_kind(store, root, k, KINDS).to_pylist() for k in KINDS}
    if not tables["responses"] and tables["rejects"]:  # every row rejected: not a success
        raise ValueError(nothing_usable(tables["rejects"]))
    baselines = [n for n in cfg.compare if cfg.methods[n].kind in ("ar", "hf")]
    return finish(rec, store, run_dir, cfg.compare, tables, [done[s["shard"]] for s in shards], baselines)


def nothing_usable(rejects: list[dict]) -> str:
    """The one line of a run whose every row was rejected: how many, the commonest reasons, and one
    of the commonest in full."""
    kinds = Counter(r["reason"].split(":")[0] for r in rejects)
    top = kinds.most_common(1)[0][0]
    example = next(f"{r['id']}: {r['reason']}" for r in rejects if r["reason"].split(":")[0] == top)
    return (f"no usable row: all {len({r['id'] for r in rejects})} rows were rejected (commonest: "
            + "; ".join(f"{why} x{n}" for why, n in kinds.most_common(3)) + f"), e.g. {example!r}")


def finish(rec: RunRecorder, store: Storage, run_dir: str, methods: list[str], tables: dict,
           records: list[dict], baselines: list[str] = ()) -> dict:
    """Aggregate the committed shards into metrics.json, report.md and latency_cdf.png; every
    speedup also against the fastest of `baselines` (AR and HF generate methods) on the same samples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs._generate import report as gr
    from jobs.lib.metrics import actor_device

    baseline = methods[0]
    for kind in ("responses", "metrics", "rejects"):  # one table each, for users and later jobs
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(tables[kind]) if tables[kind] else pa.table({}), buf)
        store.write_bytes(join(run_dir, f"{kind}.parquet"), buf.getvalue())
    tasks = gr.task_table(tables["metrics"], methods, baseline)
    throughput = gr.throughput_table(records, methods, baseline)
    memory = gr.memory_table(records, methods, baseline)
    bad = gr.mismatches(tables["responses"], methods, baseline)
    cdf = None
    if tables["metrics"]:
        cdf = "latency_cdf.png"
        store.write_bytes(join(run_dir, cdf), gr.latency_cdf_png(tables["metrics"], methods))
    rec.count("samples", sum(r["samples"] for r in records))
    rec.count("turns", sum(1 for r in tables["metrics"] if r["method"] == baseline))
    rec.count("rejects", len(tables["rejects"]))
    rec.figure("baseline", baseline)
    for m in methods[1:]:
        overall = tasks.get(gr.ALL, {}).get(m, {})
        rec.figure(f"{m}_tau", round(overall["tau"], 3) if overall.get("tau") else None)
        rec.figure(f"{m}_speedup_batch1", round(overall["speedup"], 3) if overall.get("speedup") else None)
        rec.figure(f"{m}_throughput_ratio", {b: round(t["ratio"], 3) if t["ratio"] else None
                                             for b, t in throughput[m].items()})
        rec.figure(f"{m}_{baseline}_overtakes_at_batch", gr.overtaken_at(throughput, m))
        nodes = {b: round(t["policy"]["nodes"] / max(t["policy"]["steps"], 1), 2)
                 for b, t in throughput[m].items() if t.get("policy")}
        if nodes:  # goodput: the mean tree it chose per batch size
            rec.figure(f"{m}_nodes_per_step", nodes)
        rec.figure(f"{m}_mismatches", bad.get(m, 0) + sum(t["mismatches"] for t in throughput[m].values()))
    rec.detail("per_task", tasks)
    rec.detail("throughput", throughput)
    rec.detail("memory", memory)
    fastest = gr.fastest(tasks, baselines)
    rec.figure("fastest_baseline", fastest)
    compiled = gr.compile_table(records, methods)
    rec.detail("compile", compiled)
    against = ""
    if fastest is not None:  # every speedup against the fastest baseline too (a second table if not the first)
        f_tasks, f_thr = gr.task_table(tables["metrics"], methods, fastest), gr.throughput_table(records, methods, fastest)
        for m in methods:
            if m != fastest:
                rec.figure(f"{m}_speedup_batch1_vs_fastest", _r3(f_tasks.get(gr.ALL, {}).get(m, {}).get("speedup")))
                rec.figure(f"{m}_throughput_ratio_vs_fastest", {b: _r3(t["ratio"]) for b, t in f_thr[m].items()})
        rec.detail("per_task_vs_fastest", f_tasks)
        if fastest != baseline:
            against = gr.render_against(f_tasks, f_thr, methods, fastest)
    rec.figure("rejects", [f"{r['id']}: {r['reason']}" for r in tables["rejects"]][:20])
    rec.figure("run_dir", run_dir)
    c, this = rec.cfg.compute, [r for r in records if r.get("finished_unix", 0) >= rec.started]  # this run's shards
    kind, per_actor = actor_device(c.num_gpus_per_actor, c.num_cpus_per_actor)
    rec.device_time("generate", sum(r["busy_seconds"] for r in this), per_actor, kind,
                    actors=min(c.num_actors, len(this)), samples=sum(r["samples"] for r in this),
                    tokens=sum(t["tokens"] for r in this for by_batch in r["throughput"].values()
                               for t in by_batch.values()),
                    note="a sample: every compared method at every batch size; tokens: new tokens of them all")
    return rec.finish(gr.render(tasks, throughput, memory, bad, methods, baseline, cdf) + against
                      + gr.render_compile(compiled))


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
