"""jobs/lib/job.py: every job's `__main__` is one `run_job` call, and run_job parses, runs and
turns config errors into one line with exit 2."""

import ast
import importlib
import sys
from pathlib import Path

import pytest

from jobs.lib.job import run_job
from tests.conftest import REPO

JOBS = sorted(p.stem for p in (Path(REPO) / "jobs").glob("*.py") if p.stem != "__init__")


def _main_block(job: str) -> list[ast.stmt]:
    tree = ast.parse((Path(REPO) / "jobs" / f"{job}.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
    return block.body


@pytest.mark.parametrize("job", JOBS)
def test_every_jobs_main_is_run_job_and_has_help(job, monkeypatch, capsys):
    (stmt,) = _main_block(job)
    call = stmt.value
    assert ast.unparse(call.func) == "run_job" and ast.literal_eval(call.args[0]) == job
    module = importlib.import_module(f"jobs.{job}")
    monkeypatch.setattr(sys, "argv", [f"jobs/{job}.py", "--help"])
    with pytest.raises(SystemExit) as stop:
        run_job(job, module.summary)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and module.__doc__.splitlines()[0].split(":")[0] in " ".join(out.split())


def test_an_out_of_range_value_is_one_line_and_exit_2_before_any_work(monkeypatch, capsys):
    module = importlib.import_module("jobs.generate")
    ran = []
    monkeypatch.setattr(module, "main", lambda cfg: ran.append(cfg))
    monkeypatch.setattr(sys, "argv", ["jobs/generate.py", "--config", str(Path(REPO) / "manifests/jobs/generate.yaml"),
                                      "--set", "compute.num_actors=0"])
    with pytest.raises(SystemExit) as stop:
        run_job("generate", module.summary, ValueError)
    assert stop.value.code == 2 and ran == []
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "compute.num_actors" in err[0]


def test_a_jobs_input_error_is_one_line_and_exit_1_and_its_summary_is_printed(monkeypatch, capsys):
    module = importlib.import_module("jobs.synth_data")
    argv = ["jobs/synth_data.py", "--config", str(Path(REPO) / "manifests/jobs/synth_data.yaml")]
    monkeypatch.setattr(sys, "argv", argv)

    def missing(cfg):
        raise FileNotFoundError("no such manifest: x.parquet\nmore detail")

    monkeypatch.setattr(module, "main", missing)
    with pytest.raises(SystemExit) as stop:
        run_job("synth_data", module.summary, FileNotFoundError)
    assert stop.value.code == 1
    assert capsys.readouterr().err.strip() == "synth_data: FileNotFoundError: no such manifest: x.parquet"
    monkeypatch.setattr(module, "main", lambda cfg: {"figures": {"samples_written": 3, "data_uri": "u"}})
    run_job("synth_data", module.summary, FileNotFoundError)
    assert capsys.readouterr().out.strip() == "synth_data: 3 samples -> u"
