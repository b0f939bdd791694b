"""Models from object storage: a node-local copy of a model directory named by any storage URI.

`local_model_dir(uri, storage)` gives the directory to `from_pretrained` from: a local path as it
is (made absolute), or for `s3://...` a copy downloaded once per node into `$SPEC_MODEL_CACHE`
(default `~/.cache/spec_core/models`, node-local), keyed by the object listing (relative names,
sizes, ETags): an unchanged model is never downloaded twice, a changed one gets a new entry.

    <root>/<key>/                 a finished copy; MARKER inside is written last, before the rename
    <root>/<key>.lock             flock'd by the process downloading <key>: the others on the node wait
    <root>/.tmp-<key>-<uuid>/     a download in progress; a crashed one is never used, and the next
                                  process to take the lock removes it

The driver never downloads weights: `model_identity` and `read_model_file` read single files
(config.json) through Storage. Every storage call is retried through outages like Storage's own
(`storage.retry_seconds`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from jobs.lib.storage import Storage, StorageConfig, join, retry_call, scheme_of

CACHE_ENV = "SPEC_MODEL_CACHE"
DEFAULT_ROOT = "~/.cache/spec_core/models"
MARKER = ".spec_core_complete.json"


@dataclass(frozen=True)
class ModelCopy:
    """Where a model is on this node, and what getting it there cost (0 bytes: a cache hit)."""

    path: str
    downloaded: bool
    bytes: int = 0
    seconds: float = 0.0


def cache_dir(override: str | None = None) -> Path:
    """The node-local cache: `override`, else $SPEC_MODEL_CACHE, else ~/.cache/spec_core/models."""
    return Path(override or os.environ.get(CACHE_ENV) or DEFAULT_ROOT).expanduser()


def _local_path(uri: str) -> str:
    return uri.split("://", 1)[1] if "://" in uri else uri


def local_model_dir(uri: str, storage_cfg: StorageConfig | None, cache_root: str | None = None) -> str:
    """A local directory holding the model at `uri` (downloaded once per node when remote)."""
    return fetch_model(uri, storage_cfg, cache_root).path


def fetch_model(uri: str, storage_cfg: StorageConfig | None, root: str | None = None) -> ModelCopy:
    """`local_model_dir` with the download's size and time; prints one line when it downloads."""
    if scheme_of(uri) == "file":
        return ModelCopy(str(Path(_local_path(uri)).resolve()), downloaded=False)
    store = Storage(storage_cfg)
    base = cache_dir(root)
    files = listing(store, uri)
    key = listing_key(files)
    final = base / key
    if (final / MARKER).is_file():
        return ModelCopy(str(final), downloaded=False)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (final / MARKER).is_file():
            return ModelCopy(str(final), downloaded=False)  # another process on this node got it
        for stale in base.glob(f".tmp-{key}-*"):  # only the lock holder writes these: all dead
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # without its marker: never complete (or tampered with)
            shutil.rmtree(final)
        copy = _download(store, uri, files, base / f".tmp-{key}-{uuid.uuid4().hex}", final)
    print(f"model_cache: {uri} -> {copy.path}: {len(files)} files, {copy.bytes / 2**20:.1f} MiB "
          f"in {copy.seconds:.1f} s", flush=True)
    return copy


def listing(store: Storage, uri: str) -> list[tuple[str, int, str]]:
    """(relative name, size, ETag) of every object under `uri`, sorted: one listing request."""
    fs, path = store.fs(uri)
    path = path.rstrip("/")
    found = retry_call(lambda: fs.find(path, detail=True), "list", uri, store.cfg.retry_seconds)
    files = []
    for name, info in sorted(found.items()):
        rel = name[len(path):].lstrip("/")
        if not rel:
            raise ValueError(f"{uri} is an object, not a model directory")
        tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or ""
        files.append((rel, int(info.get("size") or 0), str(tag).strip('"')))
    if not files:
        raise FileNotFoundError(f"{uri} holds no objects: not a model directory")
    return files


def listing_key(files: list[tuple[str, int, str]]) -> str:
    """The cache entry's name: a hash of the listing (so equal contents at two URIs share it)."""
    blob = json.dumps(files, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _download(store: Storage, uri: str, files: list[tuple[str, int, str]], tmp: Path, final: Path) -> ModelCopy:
    """Every file into `tmp` (streamed, sizes checked), the marker last, then one rename."""
    fs, path = store.fs(uri)
    t0 = time.perf_counter()
    try:
        for rel, size, _ in files:
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = f"{path.rstrip('/')}/{rel}"
            # a whole-file GET into the same local name: a retry overwrites, so it is idempotent
            retry_call(lambda src=src, dest=dest: fs.get_file(src, str(dest)), "read", join(uri, rel), store.cfg.retry_seconds)
            if dest.stat().st_size != size:
                raise ConnectionError(f"download of {join(uri, rel)} ended at {dest.stat().st_size} of {size} bytes")
        if listing_key(listing(store, uri)) != final.name:
            raise ValueError(f"{uri} changed while it was downloaded; rerun once it is complete")
        total, seconds = sum(f[1] for f in files), time.perf_counter() - t0
        (tmp / MARKER).write_text(json.dumps({"uri": uri, "files": len(files), "bytes": total,
                                              "seconds": round(seconds, 3)}))
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ModelCopy(str(final), downloaded=True, bytes=total, seconds=seconds)


def read_model_file(store: Storage, uri: str, name: str) -> bytes | None:
    """One file of a model directory at any URI (None if it has none): for checks on the driver,
    which never downloads the weights."""
    if scheme_of(uri) == "file":
        path = Path(_local_path(uri)) / name
        return path.read_bytes() if path.is_file() else None
    with contextlib.suppress(FileNotFoundError):
        return store.read_bytes(join(uri, name))
    return None


@contextlib.contextmanager
def _config_dir(store: Storage, uri: str):
    """A local directory holding the model's config.json: the model's own where it is local, a
    temporary copy of the file alone where it is remote (the driver never downloads weights)."""
    if scheme_of(uri) == "file":
        yield _local_path(uri)
        return
    raw = read_model_file(store, uri, "config.json")
    if raw is None:
        raise FileNotFoundError(f"target path {uri!r} is not a model directory (no config.json)")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_bytes(raw)
        yield d


def model_position_limit(store: Storage, uri: str) -> int | None:
    """The positions of the model's text decoder (spec_core's `position_limit`) from its
    config.json alone, at any URI; None where it names none."""
    from transformers import AutoConfig

    from spec_core.targets.base import position_limit

    with _config_dir(store, uri) as d:
        return position_limit(AutoConfig.from_pretrained(d, local_files_only=True))


class ModelDirError(ValueError):
    """A target directory a job cannot use (config, model class, weights); str() is the one line."""


WEIGHTS = (".safetensors", ".bin")


def model_identity(store: Storage, uri: str) -> dict:
    """spec_core's `target_identity` of the model at `uri`, naming `uri` itself (a local directory
    exactly as before, a remote one from its config.json alone), after checking on the driver
    what a worker would find late: config.json readable JSON of a supported VLM class
    (`spec_core.targets.target_config`), weights beside it. ModelDirError otherwise."""
    from spec_core.targets import target_config, target_identity

    local = scheme_of(uri) == "file"
    with _config_dir(store, uri) as d:
        if not (Path(d) / "config.json").is_file():
            raise FileNotFoundError(f"target path {uri!r} is not a model directory (no config.json)")
        try:
            target_config(d, name=f"target {uri}")
        except ValueError as err:
            raise ModelDirError(str(err)) from None
        ident = target_identity(uri) if local else {**target_identity(d), "target_path": uri}
    names = os.listdir(_local_path(uri)) if local else store.list(uri)
    if not any(n.endswith(WEIGHTS) for n in names):
        raise ModelDirError(f"target {uri} has a config.json but no weights ({' or '.join('*' + w for w in WEIGHTS)})")
    return ident
