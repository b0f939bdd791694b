"""The room of generate and benchmark (a benchmark is a grid of generate runs; their entries are
jobs/generate.py and jobs/benchmark.py): generate's config and main (job.py), the shards and their
aggregation (run.py), the actor (worker.py), the generate report (report.py) and the benchmark's
report over its runs (benchmark_report.py)."""
