"""Typed job configs: YAML + `--set a.b=c` overrides -> one strict pydantic model per job.

Every job runs as `python jobs/<name>.py --config FILE [--set section.field=value ...]`.
A typo or a wrong type fails here, before any Ray or model work, with exit code 2 and one
line naming the field and the file (`ConfigError`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

EXIT_CONFIG_ERROR = 2


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


C = TypeVar("C", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that does not validate; `str()` is the one line shown to users."""


def _error_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "<root>"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    kind = "unknown field" if first["type"] == "extra_forbidden" else "invalid value"
    detail = first["msg"] if first["type"] != "extra_forbidden" else "not a field of this job's config"
    return f"config error: {kind} '{field}' in {source}: {detail}{more}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as a YAML scalar/flow value)."""
    if "=" not in text:
        raise ConfigError(f"config error: override '{text}' must look like section.field=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"config error: override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_override(data: dict, path: list[str], value: Any) -> None:
    """Set data[path[0]]...[path[-1]] = value, creating intermediate mappings."""
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"config error: '{'.'.join(path)}': '{part}' is not a section")
        node = child
    node[path[-1]] = value


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping; a missing file or a non-mapping is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config error: config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config error: {p}{where} is not valid YAML") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {p} must hold a mapping at the top level")
    return data


def build_config(model: type[C], data: dict, source: str) -> C:
    """Validate `data` against `model`; errors become a one-line ConfigError naming field and source."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_error_line(err, source)) from None


def load_config(model: type[C], path: str | Path | None, overrides: Sequence[str] = ()) -> C:
    """YAML file (optional) + overrides -> validated config."""
    data = load_yaml(path) if path is not None else {}
    for text in overrides:
        apply_override(data, *parse_override(text))
    source = str(path) if path is not None else "<defaults>"
    if overrides:
        source += " with --set " + " ".join(overrides)
    return build_config(model, data, source)


def config_hash(cfg: BaseModel) -> str:
    """Stable short hash of the resolved config (canonical JSON)."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def config_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML (what `--config` would need to reproduce the run)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def cli(model: type[C], argv: Sequence[str] | None = None, description: str = "") -> C:
    """Parse `--config FILE --set k=v ...`; on a config error print one line and exit 2."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", help="job config YAML (see manifests/jobs/)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="override one field (repeatable); the value is parsed as YAML",
    )
    args = parser.parse_args(argv)
    try:
        return load_config(model, args.config, args.overrides)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR) from None
