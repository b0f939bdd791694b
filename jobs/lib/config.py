"""Typed job configs: YAML + `--set a.b=c` overrides -> one strict pydantic model per job.

Every job runs as `python jobs/<name>.py --config FILE [--set section.field=value ...]`.
A typo or a wrong type fails here, before any Ray or model work, with exit code 2 and one
line naming the field and the file (`ConfigError`). No message shows a secret: values of
`SecretStr` fields (and of keys named like secrets) are masked, wherever they came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints
from collections.abc import Collection, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.types import _SecretBase  # SecretStr, SecretBytes and Secret[T]

EXIT_CONFIG_ERROR = 2
MASK = "***"


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


C = TypeVar("C", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that does not validate; `str()` is the one line shown to users."""


def _secret_type(ann: Any) -> bool:
    cls = get_origin(ann) or ann  # Secret[int] -> Secret
    if isinstance(cls, type) and issubclass(cls, _SecretBase):
        return True
    return any(_secret_type(a) for a in get_args(ann))  # Optional[SecretStr], list[SecretStr]


def _secret_at(ann: Any, path: Sequence[str]) -> bool:
    """Whether the value at `path` under a field annotated `ann` is a pydantic secret."""
    if not path:
        return _secret_type(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        field = ann.model_fields.get(str(path[0]))
        return field is not None and _secret_at(field.annotation, path[1:])
    args = get_args(ann)
    if isinstance(get_origin(ann), type) and issubclass(get_origin(ann), Mapping) and len(args) == 2:
        return _secret_at(args[1], path[1:])  # path[0] is a key of the mapping
    return any(_secret_at(a, path) for a in args)  # Optional, unions, Annotated


def is_secret(model: type[BaseModel], path: Sequence[Any]) -> bool:
    """A SecretStr field of `model`, or a key named like a secret (for fields typed loosely)."""
    last = str(path[-1]).lower() if path else ""
    named = any(w in last for w in ("secret", "password", "token")) or last.endswith("key")
    return named or _secret_at(model, [str(p) for p in path])


def _secret_values(model: type[BaseModel], node: Any, path: tuple = ()) -> set[str]:
    """Every non-empty string held at a secret path of `node` (config data, overrides applied)."""
    if isinstance(node, _SecretBase):
        node = node.get_secret_value()
    if path and is_secret(model, path):
        inner = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
        found = {str(node)} if node is not None else set()
        found |= {v for x in inner for v in _secret_values(model, x, path)}
        return {v for v in found if v}
    if isinstance(node, dict):
        return {v for k, x in node.items() for v in _secret_values(model, x, path + (k,))}
    return set()


def _error_line(err: ValidationError, source: str, model: type[BaseModel] | None = None,
                secrets: Collection[str] = ()) -> str:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "<root>"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    # extra_forbidden: a pydantic model's; unexpected_keyword_argument: a spec_core dataclass's
    unknown = first["type"] in ("extra_forbidden", "unexpected_keyword_argument")
    kind = "unknown field" if unknown else "invalid value"
    detail = "not a field of this job's config" if unknown else first["msg"]
    loc = first["loc"]
    on_secret = model is not None and any(is_secret(model, loc[:i]) for i in range(1, len(loc) + 1))
    if kind == "invalid value" and (on_secret or any(s in detail for s in secrets)):
        detail = f"{first['type']} (message hidden: it concerns a secret)"  # a message may quote its input
    line = f"config error: {kind} '{field}' in {source}: {detail}{more}"
    for s in sorted(secrets, key=len, reverse=True):  # last resort: a secret equal to a key or path
        line = line.replace(s, MASK)
    return line


def shown_override(model: type[BaseModel], text: str) -> str:
    """`a.b=value` as it may appear in messages: the value masked when a.b is a secret."""
    key, sep, _ = text.partition("=")
    path = [p for p in key.strip().split(".") if p]
    return f"{key}={MASK}" if sep and (not path or is_secret(model, path)) else text


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as a YAML scalar/flow value)."""
    if "=" not in text:  # show the key only: `key:value` or `key value` would carry a value
        key = re.match(r"[\w.\-]*", text).group()
        shown = key if key == text else f"{key}..."
        raise ConfigError(f"config error: override '{shown}' must look like section.field=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"config error: override '{key}={MASK}' has an empty key")
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


def with_fields_of(config: type, base: type[C], name: str, module: str) -> type[C]:
    """The section `name`: the fields of the spec_core dataclass `config` as it declares them (types
    and defaults), beside the job's own fields of `base`, which checks the dataclass's rules by
    building it. `section.__config_dataclass__` names the dataclass."""
    hints = get_type_hints(config)
    section = create_model(name, __base__=base, __module__=module,
                           **{f.name: (hints[f.name], f.default) for f in dataclasses.fields(config)})
    section.__config_dataclass__ = config
    return section


def build_config(model: type[C], data: dict, source: str) -> C:
    """Validate `data` against `model`; errors become a one-line ConfigError naming field and source."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_error_line(err, source, model, _secret_values(model, data))) from None


def load_config(model: type[C], path: str | Path | None, overrides: Sequence[str] = ()) -> C:
    """YAML file (optional) + overrides -> validated config."""
    data = load_yaml(path) if path is not None else {}
    for text in overrides:
        apply_override(data, *parse_override(text))
    source = str(path) if path is not None else "<defaults>"
    if overrides:
        source += " with --set " + " ".join(shown_override(model, text) for text in overrides)
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
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would echo them, and a stray word may be a secret (`--set key value`)
        shown = [a.split("=", 1)[0] for a in extra if a.startswith("-")]
        if len(extra) > len(shown):
            shown.append(f"(+{len(extra) - len(shown)} value(s) not shown)")
        parser.error("unrecognized arguments: " + " ".join(shown))
    try:
        return load_config(model, args.config, args.overrides)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR) from None
