"""The precompute job's on-storage layout: shard tables, commit markers, the index.

    <artifacts>/samples/shard-00007.parquet   one row per sample (SAMPLES_SCHEMA)
    <artifacts>/visual/shard-00007.parquet    projected visual tokens and the image's shared prompt
                                              prefix states, once per image (VISUAL_SCHEMA)
    <artifacts>/rejects/shard-00007.parquet   samples that could not be used, with a reason
    <artifacts>/_committed/shard-00007.json   written last: the shard is complete (counts; each
                                              file's bytes, rows and sha256)
    <artifacts>/index.json                    written at the end: schema, target identity, shards

Shard k always holds the same manifest rows, every file is written atomically (one PUT, or
write + rename), and a shard counts only once its marker exists: a killed run is rerun by
redoing exactly the shards without a marker, so nothing is lost or duplicated. Each marker
records the run key's hash and the rows it covers (jobs.lib.run_key), checked on resume, and each
file's size, row count and sha256: `verify_shard` holds a shard's files to its marker (a file
truncated, zeroed or copied over by another shard's), and resume (`verified_shards`) redoes a shard
that does not match instead of trusting it. An image's visual
tokens live in its owner shard (the first shard that uses it): deduplicated across the run.

Samples that share an image usually share their prompt up to the end of the image (BOS, the user
header, the image placeholders): a causal target computes the same states there, so the owner
shard stores the final states of that prefix once, with the image (`prefix_ids`,
`prefix_hidden`), and each of its samples whose ids begin with exactly that prefix stores only the
rest (`prefix_len` = its length; 0 = every state in the sample's own row). The hires world asks
six questions per image: its 172 image positions are stored once instead of six times.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.lib.checksums import TEMP, file_record, mismatch
from jobs.lib.storage import Storage, join
ARTIFACT_VERSION = 2  # 2: shared image prefix states (prefix_len, prefix_ids, prefix_hidden)

SAMPLES_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("task", pa.string()),
    ("image_sha256", pa.string()),           # key into the visual tables
    ("n_tokens", pa.int32()),                # T
    ("prefix_len", pa.int32()),              # L: leading positions whose states are the image's prefix_hidden
    ("input_ids", pa.list_(pa.int32())),     # (T,)
    ("loss_mask", pa.list_(pa.bool_())),     # (T,) assistant tokens
    ("final_hidden", pa.binary()),           # (T - L, D) 16-bit, row-major: positions L..T-1
    ("mid_pos", pa.list_(pa.int32())),       # (S,) supervised positions
    ("mid_layer", pa.list_(pa.uint8())),     # (S,) min-attention-entropy hidden state index
    ("mid_hidden", pa.binary()),             # (S, D) 16-bit
])
VISUAL_SCHEMA = pa.schema([
    ("image_sha256", pa.string()),
    ("n_visual", pa.int32()),                # N (the validity mask is arange(P) < N)
    ("visual", pa.binary()),                 # (N, D) 16-bit projector output
    ("prefix_ids", pa.list_(pa.int32())),    # (L,) the shared prompt prefix through the image ([]: none)
    ("prefix_hidden", pa.binary()),          # (L, D) 16-bit final states of that prefix
])
REJECTS_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("stage", pa.string()),                  # encode | target
    ("reason", pa.string()),
])
KINDS = {"samples": SAMPLES_SCHEMA, "visual": VISUAL_SCHEMA, "rejects": REJECTS_SCHEMA}


def shard_name(k: int) -> str:
    return f"shard-{k:05d}"


def marker_uri(root: str, k: int) -> str:
    return join(root, "_committed", f"{shard_name(k)}.json")


def committed_shards(store: Storage, root: str, run_hash: str | None = None,
                     plan: list[dict] | None = None) -> dict[int, dict]:
    """shard index -> its marker record. With `run_hash` and the `plan` of shards, every marker
    must have been committed by this run key over the same rows (RunMismatch otherwise): a
    marker is never taken for work it does not hold."""
    from jobs.lib.run_key import RunMismatch

    rows = {s["shard"]: s["rows"] for s in plan or []}
    out = {}
    for name in store.list(join(root, "_committed")):
        if name.startswith("shard-") and name.endswith(".json"):
            k, rec = int(name[6:11]), json.loads(store.read_text(join(root, "_committed", name)))
            if run_hash is not None and (rec.get("config_hash") != run_hash or rec.get("rows") != rows.get(k)):
                raise RunMismatch(f"{root}: the marker of shard {k} was committed by run key "
                                  f"{rec.get('config_hash')} over other rows than this run (key {run_hash}) plans")
            out[k] = rec
    return out


def verify_shard(store: Storage, root: str, k: int, record: dict) -> str | None:
    """None when every file shard k's marker lists is there with the marker's size and checksum;
    else what differs, as one phrase naming the file."""
    files = record.get("files")
    if not files:
        return "its marker records no file checksums (written by an older version)"
    for kind, want in sorted(files.items()):
        name = f"{kind}/{shard_name(k)}.parquet"
        if why := mismatch(store, join(root, kind, f"{shard_name(k)}.parquet"), name, want):
            return why
    return None


def verified_shards(store: Storage, root: str, done: dict[int, dict], say: Callable[[str], None]) -> dict[int, dict]:
    """Resume: `done` (committed_shards) less the shards whose files do not match their markers;
    each such shard is said in one line and its marker deleted, so that the run redoes it. Temp
    files a killed writer left beside the tables (Storage's `<name>.tmp-<uuid>`) are removed."""
    orphans = [join(root, sub, name) for sub in store.list(root) for name in store.list(join(root, sub))
               if TEMP.search(name)]
    for uri in orphans:
        store.delete(uri)
    if orphans:
        say(f"removed {len(orphans)} temp files a killed run left")
    good = {}
    for k, rec in sorted(done.items()):
        why = verify_shard(store, root, k, rec)
        if why is None:
            good[k] = rec
        else:
            say(f"shard {k} does not match its marker ({why}): redoing it")
            store.delete(marker_uri(root, k))
    return good


def table_bytes(table: pa.Table, metadata: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(metadata), buf, compression="zstd")
    return buf.getvalue()


def commit_shard(store: Storage, root: str, k: int, rows: dict[str, list[dict]],
                 metadata: dict[str, str], record: dict, kinds: dict[str, pa.Schema] = KINDS) -> dict:
    """Write the shard's tables (rows per kind, schemas from `kinds`: another job's layout may
    pass its own), then its marker (the commit): `record` plus the bytes of the tables other than
    rejects and, per file, its bytes, rows and sha256. Returns the marker's record."""
    written, files = 0, {}
    for kind, kind_rows in rows.items():
        data = table_bytes(pa.Table.from_pylist(kind_rows, schema=kinds[kind]), metadata)
        store.write_bytes(join(root, kind, f"{shard_name(k)}.parquet"), data)
        written += len(data) if kind != "rejects" else 0
        files[kind] = {**file_record(data), "rows": len(kind_rows)}
    record = {**record, "shard": k, "bytes": written, "files": files, "config_hash": metadata.get("config_hash")}
    store.write_text(marker_uri(root, k), json.dumps(record))
    return record


def read_kind(store: Storage, root: str, kind: str, kinds: dict[str, pa.Schema] = KINDS) -> pa.Table:
    """All committed shards' rows of one kind, in shard order."""
    tables = []
    for k in sorted(committed_shards(store, root)):
        uri = join(root, kind, f"{shard_name(k)}.parquet")
        tables.append(pq.read_table(io.BytesIO(store.read_bytes(uri))))
    return pa.concat_tables(tables) if tables else kinds[kind].empty_table()
