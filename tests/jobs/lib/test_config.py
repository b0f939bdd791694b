import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import get_args, get_type_hints

import pytest
from pydantic import BaseModel, SecretStr, model_validator

from jobs.lib.config import (ConfigError, Strict, apply_override, build_config, cli, config_hash, load_config,
                             parse_override)
from jobs.lib.job import JobConfig, TargetSection, job_entry
from spec_core.decoding.sampling import SamplingConfig
from spec_core.decoding.tree import TreeConfig
from spec_core.fovea.config import FoveaConfig, LossConfig
from spec_core.medusa import MedusaConfig
from tests.conftest import REPO

# spec_core's configs that jobs read from YAML (a section of their own, or fields of one)
CONFIG_DATACLASSES = (TreeConfig, SamplingConfig, FoveaConfig, LossConfig, MedusaConfig)


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


def _sections(ann, seen: set) -> set:
    """Every pydantic model and dataclass reachable from the annotation `ann` (unions, lists and
    dicts looked through)."""
    if isinstance(ann, type) and (issubclass(ann, BaseModel) or dataclasses.is_dataclass(ann)):
        if ann not in seen:
            seen.add(ann)
            hints = ({n: f.annotation for n, f in ann.model_fields.items()} if issubclass(ann, BaseModel)
                     else get_type_hints(ann))
            for a in hints.values():
                _sections(a, seen)
    for a in get_args(ann):
        _sections(a, seen)
    return seen


def restated(model: type[BaseModel]) -> list[str]:
    """The fields of `model`'s sections declared twice: a spec_core config dataclass's fields held
    again by a section not built on it (or built on it but declaring some itself, or with other
    types or defaults), and a section's fields declared again by a section extending it."""
    found = []
    for section in _sections(model, set()):
        if not issubclass(section, BaseModel):
            continue
        built_on = getattr(section, "__config_dataclass__", None)
        for config in CONFIG_DATACLASSES:
            names = {f.name for f in dataclasses.fields(config)}
            if config is built_on:
                hints = get_type_hints(config)
                if names & set(section.__base__.model_fields) or {
                        f.name: (hints[f.name], f.default) for f in dataclasses.fields(config)} != {
                        n: (section.model_fields[n].annotation, section.model_fields[n].default) for n in names}:
                    found.append(f"{section.__name__} restates {config.__name__}")
            elif names <= set(section.model_fields):
                found.append(f"{section.__name__} restates {config.__name__}")
        declared = set(section.__dict__.get("__annotations__", {})) & set(section.model_fields)
        for base in section.__mro__[1:]:
            if issubclass(base, BaseModel) and base is not BaseModel and declared & set(base.model_fields):
                found.append(f"{section.__name__} redeclares {sorted(declared & set(base.model_fields))} of {base.__name__}")
    return found


@pytest.mark.parametrize("job", JOBS)
def test_each_config_field_is_declared_once(job):
    """A spec_core config dataclass declares its fields once: a job's section is the dataclass
    itself (a method's tree, the loss) or takes its fields from it (with_fields_of: the drafter,
    generation) beside fields of its own; a section extends another (the target sections extend
    jobs.lib's TargetSection) without declaring its fields again."""
    model, _ = job_entry(job)
    assert restated(model) == []
    if "target" in model.model_fields:
        assert issubclass(model.model_fields["target"].annotation, TargetSection)


def test_the_declared_once_check_catches_a_restated_field():
    class TreeSection(Strict):  # generate's section before it took spec_core's TreeConfig
        width: int = 6
        depth: int = 6
        budget: int = 40
        step_tokens: int = 0
        policy: str = "fixed"

    class Target(TargetSection):
        path: str = "elsewhere"

    class Method(Strict):
        tree: TreeSection = TreeSection()

    class Job(JobConfig):
        methods: dict[str, Method] = {}
        target: Target = Target()

    assert sorted(restated(Job)) == ["Target redeclares ['path'] of TargetSection", "TreeSection restates TreeConfig"]


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
