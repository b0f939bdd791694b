"""File checksums in commit markers: each committed file's size and sha256, recorded when it is
written and checked before a rerun or a reader trusts it (a truncated, swapped or extra file)."""

from __future__ import annotations

import hashlib
import re

from jobs.lib.storage import Storage, join

TEMP = re.compile(r"\.tmp-[0-9a-f]{32}$")  # jobs.lib.storage's atomic-write temp files


def digest(data: bytes) -> str:
    """A file's content checksum in its marker (sha256: ~1.3 GB/s on one core here, beside a
    zstd Parquet write of the same bytes)."""
    return hashlib.sha256(data).hexdigest()


def file_record(data: bytes) -> dict:
    """What a marker records of one file: its size and sha256."""
    return {"bytes": len(data), "sha256": digest(data)}


def mismatch(store: Storage, uri: str, name: str, want: dict) -> str | None:
    """None when the file at `uri` has the size and checksum `want` records; else what differs, as
    one phrase naming it `name`."""
    try:
        data = store.read_bytes(uri)
    except FileNotFoundError:
        return f"{name} is missing"
    if len(data) != want["bytes"]:
        return f"{name} has {len(data)} bytes, its marker says {want['bytes']}"
    if digest(data) != want["sha256"]:
        return f"{name} is not the file its marker was written for (sha256 differs, same size)"
    return None


def folder_record(store: Storage, uri: str, marker: str) -> dict[str, dict]:
    """file name -> file_record for every file in folder `uri` but its `marker` (and temp files)."""
    return {name: file_record(store.read_bytes(join(uri, name))) for name in sorted(store.list(uri))
            if name != marker and not TEMP.search(name)}


def verify_folder(store: Storage, uri: str, marker: str, files: dict[str, dict] | None) -> str | None:
    """None when folder `uri` holds exactly the files `files` records, each matching; else what
    differs, as one phrase (a file more would add rows to every reader of the folder)."""
    if not files:
        return "its marker records no file checksums (written by an older version)"
    extra = sorted(n for n in store.list(uri) if n != marker and n not in files and not TEMP.search(n))
    if extra:
        return f"{extra[0]} is not in its marker ({len(extra)} files more than it recorded)"
    for name, want in sorted(files.items()):
        if why := mismatch(store, join(uri, name), name, want):
            return why
    return None
