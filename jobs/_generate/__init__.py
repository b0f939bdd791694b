"""The room of generate and benchmark (a benchmark is a grid of generate runs; the config and main of
both are their entries jobs/generate.py and jobs/benchmark.py): the shards and their aggregation (run.py),
the actor (worker.py), the generate report (report.py) and the benchmark's report over its runs
(benchmark_report.py)."""
