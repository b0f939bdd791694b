"""The generate job's shards and report (its config and main: jobs/_generate/job.py; also run by
jobs/benchmark.py, whose settings are generate runs over the method zoo): the manifest's files,
their deterministic shards, and the committed shards aggregated into metrics.json and report.md."""

from __future__ import annotations

import io
from collections import Counter


from jobs.lib.metrics import RunRecorder
from jobs.lib.storage import Storage, join


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
