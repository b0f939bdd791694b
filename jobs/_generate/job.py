"""The generate job's config and run, in the room generate shares with the benchmark (a grid of
generate runs): jobs/generate.py is its command line, jobs/benchmark.py runs it per setting."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from jobs._generate.run import finish, manifest_files, nothing_usable, plan_shards
from jobs.lib.artifact_store import committed_shards, read_kind, verified_shards
from jobs.lib.config import Strict, with_fields_of
from jobs.lib.job import DecodeComputeSection, JobConfig, LoadedTargetSection
from jobs.lib.manifest_rows import check_manifest
from jobs.lib.metrics import RunRecorder
from jobs.lib.model_cache import model_identity, model_position_limit, read_model_file
from jobs.lib.ray_setup import init_ray
from jobs.lib.run_key import fingerprint, open_run
from jobs.lib.storage import Storage, join, scheme_of
from spec_core.decoding.sampling import SamplingConfig
from spec_core.decoding.tree import TreeConfig


class DataSection(Strict):
    manifest: str = Field("runs/build_manifests/reference/eval",
                          description="an evaluation manifest (Parquet) or a folder of them, any URI")
    limit_per_source: int | None = Field(None, ge=1, description="N rows of each manifest file: a seeded "
                                         "sample stratified by task (jobs.lib.subset), not the first N")
    seed: int = Field(0, description="seed of the `limit_per_source` sample")
    max_length: int = Field(2048, ge=8, description="longer prompts are rejected")
    shard_size: int = Field(16, ge=1, description="samples per committed shard (and per throughput stream)")


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
    tree: TreeConfig = TreeConfig()  # spec_core.decoding.TreeConfig; policy goodput: spec_core.decoding.goodput

    NOT_COMPUTING: ClassVar[frozenset[str]] = frozenset({"compile"})  # the same outputs either way
    _tree_keys: frozenset[str] = PrivateAttr(frozenset())  # the tree fields the config sets

    @model_validator(mode="wrap")
    @classmethod
    def _tree_set(cls, data, handler):
        """Which tree fields the config sets: a key of its mapping, or a field a TreeConfig changes
        (also one assigned later: pydantic hands a wrap validator the model, before assignment)."""
        before = data.tree if isinstance(data, cls) else None
        m = handler(data)
        tree = data.get("tree") if isinstance(data, dict) else m.tree if m.tree is not before else None
        if isinstance(tree, TreeConfig):
            tree = {f.name for f in dataclasses.fields(tree) if getattr(tree, f.name) != f.default}
        if tree is not None:
            m._tree_keys = frozenset(tree)
        return m

    def drafted_tree(self) -> TreeConfig:
        """The tree this method drafts: a training-free method's own size unless the config sets a budget."""
        from spec_core.decoding.proposers import DEFAULT_BUDGET

        if self.kind in DEFAULT_BUDGET and "budget" not in self._tree_keys:
            return dataclasses.replace(self.tree, budget=DEFAULT_BUDGET[self.kind])
        return self.tree

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


class _GenerationExtras(Strict):
    """What the `generation` section holds beside spec_core.decoding.SamplingConfig's fields (the
    target's rule, the same for every method; added below, declared there once)."""

    max_new_tokens: int = Field(256, ge=1)
    seed: int = 0
    track_visual: bool = Field(False, description="record each batch-1 step's last-layer attention share on "
                               "the image (MMSpec Table 7); one extra eager attention per step")

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(**self.model_dump(include={f.name for f in dataclasses.fields(SamplingConfig)}))

    @model_validator(mode="after")
    def _checked(self):  # the dataclass's own checks, as validation errors (exit 2)
        self.sampling_config()
        return self


GenerationSection = with_fields_of(SamplingConfig, _GenerationExtras, "GenerationSection", __name__)


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
    target: LoadedTargetSection = LoadedTargetSection()
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
    plans = [MethodPlan(name=name, drafter=local(m.drafter) if m.drafter else None,
                        visual_correction=m.visual_correction, tree=m.drafted_tree(),
                        correction_depth=m.correction_depth,
                        proposer=m.kind if m.kind not in ("ar", "hf", *TRAINED) else None, params=dict(m.params),
                        viskip=m.viskip, hf=m.kind == "hf", compile=m.compile)
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
                sampling=dataclasses.asdict(gen.sampling_config()),
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
