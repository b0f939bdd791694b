"""The room of generate and benchmark (a benchmark is a grid of generate runs): the run (run.py), its actor
(worker.py), the generate report (report.py) and the benchmark's report over its runs (benchmark_report.py)."""
