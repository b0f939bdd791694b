import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr, model_validator

from jobs.lib.config import (ConfigError, Strict, apply_override, build_config, cli, config_hash, load_config,
                             parse_override)
from jobs.lib.job import JobConfig, job_entry
from tests.conftest import REPO


class Inner(Strict):
    lr: float = 1e-3
    steps: int = 10


class Root(JobConfig):
    train: Inner = Inner()


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_yaml_and_overrides(tmp_path):
    p = write(tmp_path, "train:\n  lr: 0.1\n")
    cfg = load_config(Root, p, ["train.steps=7", "run.output_uri=s3://b/x"])
    assert cfg.train.lr == 0.1 and cfg.train.steps == 7 and cfg.run.output_uri == "s3://b/x"


def test_typo_names_field_and_file(tmp_path):
    p = write(tmp_path, "train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(Root, p)
    msg = str(e.value)
    assert "train.lrr" in msg and str(p) in msg and "\n" not in msg


def test_wrong_type_names_field(tmp_path):
    p = write(tmp_path, "train:\n  steps: many\n")
    with pytest.raises(ConfigError, match=r"invalid value 'train.steps'"):
        load_config(Root, p)


def test_override_typo_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="train.stepz"):
        load_config(Root, None, ["train.stepz=3"])


def test_override_parsing():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=s3://x/y") == (["a"], "s3://x/y")
    with pytest.raises(ConfigError):
        parse_override("novalue")
    d = {"a": 1}
    with pytest.raises(ConfigError, match="not a section"):
        apply_override(d, ["a", "b"], 2)


def test_hash_and_run_id_are_stable():
    a, b = Root(), Root(train=Inner(lr=0.5))
    assert config_hash(a) == config_hash(Root()) != config_hash(b)
    # where outputs go does not change the run id, what the run does does
    moved = Root(run={"output_uri": "s3://elsewhere"})
    assert moved.resolved_run_id() == a.resolved_run_id() != b.resolved_run_id()
    assert Root(run={"run_id": "mine"}).run_dir("j").endswith("j/mine")


def test_secrets_never_serialised():
    cfg = Root(storage={"access_key_id": "AKIAXXX", "secret_access_key": "hunter2"})
    dumped = str(cfg.model_dump(mode="json"))
    assert "hunter2" not in dumped and "AKIAXXX" not in dumped


JOBS = sorted(p.stem for p in (Path(REPO) / "jobs").glob("*.py") if p.stem != "__init__")


def test_every_job_is_covered():
    assert "synth_data" in JOBS


# train_drafter's entry imports spec_core.fovea (torch, transformers) before it reads the config: ~8 s
@pytest.mark.parametrize("job", [pytest.param(j, marks=pytest.mark.slow) if j == "train_drafter" else j
                                 for j in JOBS])
def test_job_cli_exits_2_on_typo(tmp_path, job):
    p = write(tmp_path, "run:\n  output_urii: x\n")
    r = subprocess.run([sys.executable, f"jobs/{job}.py", "--config", str(p)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "run.output_urii" in lines[0] and str(p) in lines[0]
    assert "ray" not in r.stdout.lower()  # failed before any Ray work


@pytest.mark.parametrize("job", JOBS)
def test_the_jobs_shipped_yaml_validates(job):
    """manifests/jobs/<job>.yaml loads into the job's own config class (the docs run these)."""
    model, _ = job_entry(job)
    load_config(model, Path(REPO) / "manifests" / "jobs" / f"{job}.yaml")


SECRET = "s3cr3t-value"


def test_a_misspelt_key_next_to_a_secret_names_the_key_not_the_secret(tmp_path):
    p = write(tmp_path, "run:\n  output_uri: x\n")
    r = subprocess.run([sys.executable, "jobs/synth_data.py", "--config", str(p),
                        "--set", f"storage.secret_access_key={SECRET}", "--set", "run.output_urii=y"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "run.output_urii" in lines[0] and str(p) in lines[0]
    assert SECRET not in r.stderr + r.stdout and "storage.secret_access_key=***" in lines[0]


def test_an_invalid_value_elsewhere_does_not_echo_the_secret(capsys):
    with pytest.raises(SystemExit) as e:
        cli(Root, ["--set", f"storage.secret_access_key={SECRET}", "--set", "train.steps=many"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid value 'train.steps'" in err and SECRET not in err


def test_secret_like_names_are_masked_when_not_typed_secret():
    class Hub(Strict):
        api_token: str = ""  # typed loosely: the name marks it

    class WithHub(JobConfig):
        hub: Hub = Hub()

    with pytest.raises(ConfigError) as e:
        load_config(WithHub, None, [f"hub.api_token={SECRET}", "hub.url=x"])
    assert "hub.url" in str(e.value) and SECRET not in str(e.value)


class Leaky(JobConfig):
    """A validator whose message quotes the secret (pydantic copies it into `msg`)."""

    train: Inner = Inner()

    @model_validator(mode="after")
    def _reject(self):
        if self.train.steps < 0:
            raise ValueError(f"credentials {self.storage.secret_access_key.get_secret_value()} rejected")
        return self


def test_pydantics_own_message_and_input_cannot_leak_the_secret(tmp_path):
    p = write(tmp_path, f"storage:\n  secret_access_key: {SECRET}\n")  # from the file, not --set
    for model, overrides in [(Leaky, ["train.steps=-1"]),  # a message quoting it
                             (Root, [f"storage.secret_access_key=[{SECRET}]"])]:  # a bad input: itself
        with pytest.raises(ConfigError) as e:
            load_config(model, p, overrides)
        msg = str(e.value)
        assert SECRET not in msg and str(p) in msg and "\n" not in msg and "invalid value" in msg
    # secrets already held as SecretStr (the batch scheduler re-validates a dumped config)
    data = {"storage": {"secret_access_key": SecretStr(SECRET)}, "train": {"steps": -1}}
    with pytest.raises(ConfigError) as e:
        build_config(Leaky, data, "batch b1")
    assert SECRET not in str(e.value) and "batch b1" in str(e.value)


def test_malformed_overrides_and_stray_arguments_do_not_echo_values(capsys):
    for text in [f"storage.secret_access_key:{SECRET}", f"={SECRET}"]:
        with pytest.raises(ConfigError) as e:
            parse_override(text)
        assert SECRET not in str(e.value)
    with pytest.raises(SystemExit) as e:  # `--set key value`: argparse would echo the stray value
        cli(Root, ["--set", "storage.secret_access_key", SECRET])
    assert e.value.code == 2 and SECRET not in capsys.readouterr().err
