"""MMSpec-style benchmark of VLM speculative decoding: every method on one engine, one cache, one
timing protocol, so that differences are the methods'.

    python jobs/benchmark.py --config manifests/jobs/benchmark.yaml [--set data.limit_per_source=20]
    ray job submit --working-dir . -- python jobs/benchmark.py --config manifests/jobs/benchmark.yaml

For each setting (temperature 0 = greedy, 0.6 = MMSpec's second setting) the generate job runs the
compared methods on the evaluation manifest (six subtasks; the reference world's eval split has 100
samples each, like MMSpec's 600; MMSpec's own jsonl goes through build_manifests) on a Ray actor
pool: batch 1 per sample, methods interleaved, warm-up excluded, then every batch size as a
continuous-batching stream; each step's visual-attention share is recorded. The benchmark's run
directory gets report.md with a Table-3-shaped grid (MAT and speedup per subtask and overall),
95% paired-bootstrap intervals of the overall speedups (and which methods are within noise of the
fastest), mean per-sample speedups, throughput per batch size, acceptance on high- vs low-visual
steps, and PNG plots; metrics.json holds every figure.

The zoo (`methods`): AR; training-free PLD, SAM, Lookahead, Token Recycling (MMSpec Table 6);
trained on the same precompute artifacts by train_drafter - Medusa heads, the EAGLE-2-style drafter
(no visual correction), the MSD-style `prefix` and ViSpec-style `compressed` visual contexts, and
FOVEA; ViSkip on any of them. The generate runs stay under
<output>/generate/<run_id>-t<temperature>/ (a rerun resumes them).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

from pydantic import Field, model_validator  # noqa: E402

from jobs._generate.job import ComputeSection, DataSection, GenerateConfig, MethodSection  # noqa: E402
from jobs._generate.job import main as generate_main  # noqa: E402
from jobs.lib.job import JobConfig, LoadedTargetSection, RunSection, run_job  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.run_key import open_run  # noqa: E402
from jobs.lib.storage import Storage, join  # noqa: E402


class BenchmarkConfig(JobConfig):
    data: DataSection = DataSection(limit_per_source=100)
    target: LoadedTargetSection = LoadedTargetSection()
    # the zoo is declared in the job's YAML (manifests/jobs/benchmark.yaml), nowhere else
    methods: dict[str, MethodSection] = Field(min_length=1, description="name -> method, as in generate")
    compare: list[str] = Field(min_length=2, description="the first is the baseline (AR)")
    temperatures: list[float] = Field([0.0, 0.6], min_length=1, description="0 = greedy")
    max_new_tokens: int = Field(1024, ge=1, description="MMSpec: 1024")
    seed: int = 0
    visual_threshold: float = Field(0.35, gt=0, le=1, description="high-visual steps: share >= this")
    compute: ComputeSection = ComputeSection(batch_sizes=[1, 2, 4, 8])

    @model_validator(mode="after")
    def _valid(self):
        unknown = [m for m in self.compare if m not in self.methods]
        if unknown:
            raise ValueError(f"compare names {unknown}, not in methods {sorted(self.methods)}")
        if any(t < 0 for t in self.temperatures) or len(set(self.temperatures)) != len(self.temperatures):
            raise ValueError("temperatures must be distinct and >= 0")
        return self

    def computing(self) -> BenchmarkConfig:
        """Only the compared methods determine the outputs."""
        return self.model_copy(update={"methods": {n: self.methods[n] for n in self.compare}})

    def generate_config(self, temperature: float) -> GenerateConfig:
        """The generate run of one setting (its own run directory, so each setting resumes)."""
        return GenerateConfig(
            run=RunSection(output_uri=self.run.output_uri, run_id=f"{self.resolved_run_id()}-t{temperature:g}",
                           on_mismatch=self.run.on_mismatch),
            storage=self.storage, ray=self.ray, cost=self.cost, data=self.data, target=self.target, compute=self.compute,
            methods={m: self.methods[m] for m in self.compare}, compare=self.compare,
            generation={"max_new_tokens": self.max_new_tokens, "do_sample": temperature > 0,
                        "temperature": temperature if temperature > 0 else 1.0, "seed": self.seed,
                        "track_visual": True})


def main(cfg: BenchmarkConfig) -> dict:
    import pyarrow.parquet as pq

    from jobs._generate import benchmark_report as br

    store = Storage(cfg.storage)
    run_dir = cfg.run_dir("benchmark")
    gcfgs = [cfg.generate_config(t) for t in cfg.temperatures]  # every setting validates before any work
    open_run(cfg, "benchmark", store)  # its generate runs check their own keys and inputs
    rec = RunRecorder("benchmark", cfg, run_dir, store)
    baseline, settings = cfg.compare[0], []
    for t, gcfg in zip(cfg.temperatures, gcfgs):
        name = "greedy (temperature 0)" if t == 0 else f"sampling at temperature {t:g}"
        with rec.stage(f"generate_t{t:g}"):
            try:
                g = generate_main(gcfg)
            except ValueError as err:  # every turn rejected: nothing to compare at this setting
                if str(err).startswith("no usable row"):
                    raise ValueError(f"{name}: {err}") from None
                raise
        rec.include_cost(f"generate_t{t:g}", g)  # the generate run's device time, priced by this config
        gdir = g["figures"]["run_dir"]
        metrics = pq.read_table(io.BytesIO(store.read_bytes(join(gdir, "metrics.parquet")))).to_pylist()
        tasks, throughput = g["details"]["per_task"], g["details"]["throughput"]
        st = {"name": name, "sampled": t > 0, "samples": g["counts"].get("samples", 0),
              "turns": g["counts"].get("turns", 0), "tasks": tasks, "throughput": throughput,
              "per_sample": br.per_sample_speedup(metrics, cfg.compare, baseline),
              "visual": br.visual_split(metrics, cfg.compare, cfg.visual_threshold),
              "bootstrap": br.bootstrap_speedups(metrics, cfg.compare, baseline, seed=cfg.seed),
              "mismatches": sum(g["figures"].get(f"{m}_mismatches") or 0 for m in cfg.compare[1:]),
              "fastest": g["figures"].get("fastest_baseline"),
              "vs_fastest": {m: g["figures"].get(f"{m}_speedup_batch1_vs_fastest") for m in cfg.compare
                             if g["figures"].get(f"{m}_speedup_batch1_vs_fastest") is not None},
              "generate_run": gdir, "plots": []}
        tag = f"t{t:g}"
        for fname, png in ((f"speedup_{tag}.png", br.speedup_png(tasks, cfg.compare, baseline,
                                                                 f"speedup per subtask, {name}")),
                           (f"batch_{tag}.png", br.batch_png(throughput, cfg.compare, baseline,
                                                             f"batch-size sensitivity, {name}")),
                           (f"visual_{tag}.png", br.visual_png(st["visual"], cfg.compare, cfg.visual_threshold,
                                                               f"acceptance vs visual grounding, {name}"))):
            store.write_bytes(join(run_dir, fname), png)
            st["plots"].append(fname)
        store.write_bytes(join(run_dir, f"latency_cdf_{tag}.png"), store.read_bytes(join(gdir, "latency_cdf.png")))
        st["plots"].append(f"latency_cdf_{tag}.png")
        settings.append(st)
        overall = tasks.get("all", {})
        for m in cfg.compare[1:]:
            rec.figure(f"{tag}_{m}", {"mat": _r(overall.get(m, {}).get("mat")),
                                      "speedup": _r(overall.get(m, {}).get("speedup")),
                                      "per_sample_speedup": _r(st["per_sample"].get(m))})
    rec.detail("settings", [{k: v for k, v in s.items() if k != "plots"} for s in settings])
    rec.figure("run_dir", run_dir)
    return rec.finish(br.render(settings, cfg.compare, baseline, cfg.visual_threshold))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def summary(cfg: BenchmarkConfig, m: dict) -> list[str]:
    return [f"{k}: MAT {v['mat']}, speedup {v['speedup']}x (per-sample mean {v['per_sample_speedup']}x)"
            for k, v in m["figures"].items() if isinstance(v, dict)] + [f"-> {m['figures']['run_dir']}"]


if __name__ == "__main__":
    run_job("benchmark", summary, FileNotFoundError, PermissionError, ConnectionError, ValueError)
