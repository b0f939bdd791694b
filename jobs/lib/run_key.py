"""Runs keyed by what they compute: a run directory belongs to one computing config.

Every resumable job calls `open_run(cfg, job, store, inputs)` before it writes anything. The key
is the job's config without the fields that cannot change its outputs (where it writes, how Ray
is reached, storage credentials, actor counts and other `NOT_COMPUTING` fields of each section),
plus fingerprints of its inputs (the target's weights, a manifest, a drafter). It is written to
`<run>/run_key.json`; commit markers carry its hash.

    same key        -> the run resumes (committed work is skipped, as before)
    another key     -> one line naming the fields that differ, exit 2, before any work
                       (`run.on_mismatch: restart` removes the old run and starts afresh)

so a rerun into an explicit run id never mixes the outputs of two configs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from pydantic import BaseModel

from jobs.lib.storage import Storage, join

KEY_FILE = "run_key.json"
SHOWN_DIFFS = 4
_CHUNK = 1 << 16          # bytes read per sample of a large file
_SAMPLES = 16             # samples per large file (plus its size): a fingerprint, not a checksum


class RunMismatch(Exception):
    """The run directory holds a run of another computing config; `str()` is the one line shown."""


def computing_fields(cfg: BaseModel) -> dict[str, Any]:
    """Flat {dotted.field: JSON value} of the fields that determine a run's outputs: every field
    except those a section lists in its `NOT_COMPUTING` class variable."""
    out: dict[str, Any] = {}

    def walk(model: BaseModel, prefix: str) -> None:
        skip = getattr(type(model), "NOT_COMPUTING", frozenset())
        for name in type(model).model_fields:
            if name in skip:
                continue
            value, key = getattr(model, name), f"{prefix}{name}"
            if isinstance(value, BaseModel):
                walk(value, key + ".")
            elif dataclasses.is_dataclass(value):  # a spec_core config used as a section (train's loss)
                for f in dataclasses.fields(value):
                    out[f"{key}.{f.name}"] = _jsonable(getattr(value, f.name))
            elif isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
                for k, v in value.items():  # e.g. generate's methods: {name: MethodSection}
                    walk(v, f"{key}.{k}.")
            else:
                out[key] = _jsonable(value)

    walk(cfg, "")
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str))


def key_hash(key: dict) -> str:
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_key(cfg: BaseModel, job: str, inputs: dict[str, Any] | None = None) -> dict:
    """{job, fields, inputs, hash}: what a run of `job` with `cfg` on `inputs` computes."""
    key = {"job": job, "fields": computing_fields(cfg.computing()),
           "inputs": {k: _jsonable(v) for k, v in sorted((inputs or {}).items())}}
    return {**key, "hash": key_hash(key)}


def differences(old: dict, new: dict) -> list[str]:
    """'name: old -> new' for every computing field or input that differs."""
    out = []
    for part in ("fields", "inputs"):
        a, b = old.get(part, {}), new.get(part, {})
        for name in sorted(set(a) | set(b)):
            if a.get(name, "<unset>") != b.get(name, "<unset>"):
                label = name if part == "fields" else f"input {name}"
                out.append(f"{label}: {_short(a.get(name, '<unset>'))} -> {_short(b.get(name, '<unset>'))}")
    return out


def _short(value: Any, n: int = 40) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= n else text[: n - 3] + "..."


def open_run(cfg: BaseModel, job: str, store: Storage, inputs: dict[str, Any] | None = None,
             run_dir: str | None = None) -> dict:
    """Claim `cfg`'s run directory for this computing config before any work; returns the key.

    Raises RunMismatch when the directory holds another config's run (or outputs without a key)
    and `cfg.run.on_mismatch` is 'fail'; with 'restart' the old run is removed first."""
    run_dir = run_dir or cfg.run_dir(job)
    key, uri = run_key(cfg, job, inputs), join(run_dir, KEY_FILE)
    blob = json.dumps(key, indent=2, sort_keys=True).encode()
    old = json.loads(store.read_text(uri)) if store.exists(uri) else None
    if old is None:
        leftovers = store.list(run_dir)
        if not leftovers and store.create_exclusive(uri, blob):
            return key
        # a concurrent run of the same id claimed it first, or an old version wrote outputs here
        old = json.loads(store.read_text(uri)) if store.exists(uri) else {"legacy": leftovers}
    if old.get("hash") == key["hash"]:
        return key  # the same work: resume
    if "legacy" in old:
        why = [f"{len(old['legacy'])} entries ({', '.join(old['legacy'][:3])}) written without a run key"]
    else:
        why = differences(old, key) or ["the key format changed"]
    more = f" (+{len(why) - SHOWN_DIFFS} more)" if len(why) > SHOWN_DIFFS else ""
    what = "; ".join(why[:SHOWN_DIFFS]) + more
    if cfg.run.on_mismatch == "fail":
        raise RunMismatch(f"{job}: {run_dir} holds a run of another config ({what}); rerun with "
                          f"--set run.on_mismatch=restart to replace it, or choose another run.run_id")
    store.delete(run_dir, recursive=True)
    print(f"{job}: removed the previous run at {run_dir} (another config: {what}); starting afresh")
    if not store.create_exclusive(uri, blob):
        raise RunMismatch(f"{job}: another run claimed {run_dir} while this one restarted it")
    return key


def fingerprint(store: Storage, uri: str) -> str:
    """A cheap content fingerprint of a file or folder (a model directory, a manifest): names and
    sizes of every file, with sampled bytes of local files (ETags on object storage), so a rebuilt
    model at the same path is told apart without reading gigabytes."""
    fs, path = store.fs(uri)
    h = hashlib.sha256()
    files = sorted(fs.find(path, detail=True).items()) if fs.isdir(path) else [(path, fs.info(path))]
    for name, info in files:
        size = int(info.get("size") or 0)
        h.update(f"{name[len(path):]}|{size}|".encode())
        tag = info.get("ETag") or info.get("etag")
        if tag:
            h.update(str(tag).encode())
            continue
        with fs.open(name, "rb") as f:
            if size <= _CHUNK * _SAMPLES:
                h.update(f.read())
                continue
            for i in range(_SAMPLES):
                f.seek((size - _CHUNK) * i // (_SAMPLES - 1))
                h.update(f.read(_CHUNK))
    return h.hexdigest()[:16]
