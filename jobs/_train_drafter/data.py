"""Precompute artifacts -> the drafter's training rows, streamed with Ray Data.

    art = open_artifacts(store, uri, "fail")  # index.json + committed shards, each verified (one-line errors)
    check_target(art, target_identity(path))  # hidden size, target config hash
    ds = training_dataset(art, store, seed)    # SAMPLES rows + their image's `visual` / `n_visual`
    samples = decode_rows(batch, art.hidden_size, art.hidden_dtype)   # on the training worker

The layout is jobs.lib.artifact_store's. An image's visual tokens live in its owner shard (the
first shard that used it), which is often not the sample's own shard: `sha_owners` maps each
image hash to the shard holding it (read from the visual tables' hash column only), and
`attach_visual` reads just the rows a batch needs from each owner table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.lib.artifact_store import ARTIFACT_VERSION, committed_shards, shard_name, verify_shard
from jobs.lib.storage import Storage, StorageConfig, join

# What a training worker reads of a SAMPLES_SCHEMA row (not source, task, mid_layer).
TRAIN_COLUMNS = ["id", "image_sha256", "n_tokens", "prefix_len", "input_ids", "loss_mask", "final_hidden", "mid_pos",
                 "mid_hidden"]


class ArtifactError(ValueError):
    """Artifacts that cannot be trained on; `str()` is the one line shown to users."""


@dataclass
class Artifacts:
    """A finished precompute run's artifacts."""

    root: str
    index: dict
    shards: list[int]                  # committed shard ids, ascending (verified; less the quarantined)
    n_samples: int                     # samples to train on
    visual_shards: list[int] = field(default_factory=list)
    quarantined: dict[int, str] = field(default_factory=dict)  # on_bad_shard skip: shard -> what differs
    lost_samples: int = 0              # ... the samples they held, and those whose image only they held
    owners: dict[str, int] = field(default_factory=dict)  # image sha256 -> the shard holding its tokens

    @property
    def hidden_size(self) -> int:
        return int(self.index["hidden_size"])

    @property
    def hidden_dtype(self) -> str:
        return str(self.index["hidden_dtype"])

    def shard_uri(self, kind: str, k: int) -> str:
        return join(self.root, kind, f"{shard_name(k)}.parquet")


def open_artifacts(store: Storage, uri: str, on_bad_shard: str = "fail") -> Artifacts:
    """Read and check a precompute run's index: it must be finished, of this artifact version,
    and every shard it lists committed, its files matching its marker (`verify_shard`). A shard
    that does not match: `on_bad_shard` fail -> ArtifactError; skip -> quarantined with its reason,
    with it the samples of other shards whose image only it held. Raises ArtifactError (one line)."""
    index_uri = join(uri, "index.json")
    try:
        if not store.exists(index_uri):
            what = "does not exist" if not store.exists(uri) else "has no index.json (an unfinished precompute run?)"
            raise ArtifactError(f"artifacts {uri} {what}")
        index = json.loads(store.read_text(index_uri))
    except ArtifactError:
        raise
    except Exception as err:  # noqa: BLE001 - storage clients and JSON raise their own types
        raise ArtifactError(f"artifacts {uri}: cannot read index.json: {type(err).__name__}: {err}") from None
    version = index.get("artifact_version")
    if version != ARTIFACT_VERSION:
        raise ArtifactError(f"artifacts {uri} have artifact_version {version}, this code reads {ARTIFACT_VERSION}")
    missing = [k for k in ("hidden_size", "hidden_dtype", "target_config_sha256", "shards") if k not in index]
    if missing:
        raise ArtifactError(f"artifacts {uri}: index.json lacks {missing}")
    done = committed_shards(store, uri)
    lost = sorted(set(index["shards"]) - set(done))
    if lost:
        raise ArtifactError(f"artifacts {uri}: {len(lost)} shards listed in index.json are not committed: {lost[:5]}")
    bad = {k: why for k in sorted(index["shards"]) if (why := verify_shard(store, uri, k, done[k])) is not None}
    if bad and on_bad_shard == "fail":
        k, why = next(iter(bad.items()))
        raise ArtifactError(f"artifacts {uri}: shard {k} does not match its marker ({why}); {len(bad)} such shards, "
                            f"nothing trained (rerun precompute to redo them, or data.on_bad_shard=skip)")
    shards = [k for k in sorted(index["shards"]) if k not in bad]
    visual = [k for k in shards if done[k]["files"].get("visual", {}).get("rows", 0) > 0]
    art = Artifacts(uri, index, shards, 0, visual, bad)
    art.owners = sha_owners(art, store)
    n = sum(int(done[k]["samples"]) for k in shards)
    if bad:  # samples whose image tokens were in a quarantined shard go with it
        orphans = sum(1 for k in shards for sha in _column(store, art.shard_uri("samples", k), "image_sha256")
                      if sha and sha not in art.owners)
        art.lost_samples = sum(int(done[k]["samples"]) for k in bad) + orphans
        n -= orphans
    if n == 0:
        raise ArtifactError(f"artifacts {uri} hold no samples" + (f" outside {len(bad)} quarantined shards" if bad else ""))
    art.n_samples = n
    return art


def _column(store: Storage, uri: str, name: str) -> list:
    fs, path = store.arrow_fs(uri)
    return pq.read_table(path, filesystem=fs, columns=[name]).column(0).to_pylist()


def check_target(art: Artifacts, identity: dict) -> None:
    """The artifacts must come from this target (spec_core.targets.target_identity)."""
    ix = art.index
    if ix["hidden_size"] != identity["hidden_size"]:
        raise ArtifactError(f"artifacts {art.root} have hidden_size {ix['hidden_size']} but target "
                            f"{identity['target_path']} has {identity['hidden_size']}")
    if ix["target_config_sha256"] != identity["target_config_sha256"]:
        raise ArtifactError(f"artifacts {art.root} were computed by target {ix.get('target_path')} "
                            f"(config {ix['target_config_sha256']}), not by {identity['target_path']} "
                            f"(config {identity['target_config_sha256']})")


def sha_owners(art: Artifacts, store: Storage) -> dict[str, int]:
    """image sha256 -> the shard whose visual table holds it (reads one column per table)."""
    owners: dict[str, int] = {}
    for k in art.visual_shards:
        for sha in _column(store, art.shard_uri("visual", k), "image_sha256"):
            owners.setdefault(sha, k)
    return owners


def attach_visual(table: pa.Table, root: str, owners: dict[str, int], storage: StorageConfig,
                  drop_unowned: bool = False) -> pa.Table:
    """Ray Data map_batches UDF: add each row's image tokens (`visual` bytes, `n_visual`) and the
    image's shared prompt prefix (`prefix_ids`, `prefix_hidden`), reading only the needed rows of
    each owner shard's visual table. drop_unowned: rows whose image no shard holds (its owner was
    quarantined) are dropped, not an error."""
    store = Storage(storage)
    if drop_unowned:
        table = table.filter(pa.array([not s or s in owners for s in table.column("image_sha256").to_pylist()]))
    shas = table.column("image_sha256").to_pylist()
    wanted: dict[int, set[str]] = {}
    for sha in shas:
        if sha:
            if sha not in owners:
                raise ArtifactError(f"artifacts {root}: no visual tokens for image {sha}")
            wanted.setdefault(owners[sha], set()).add(sha)
    found: dict[str, dict] = {}
    for k, need in wanted.items():
        fs, path = store.arrow_fs(join(root, "visual", f"{shard_name(k)}.parquet"))
        rows = pq.read_table(path, filesystem=fs, filters=pc.field("image_sha256").isin(sorted(need)))
        for r in rows.to_pylist():
            found[r["image_sha256"]] = r
    none = {"n_visual": 0, "visual": None, "prefix_ids": [], "prefix_hidden": b""}
    for col, kind in (("n_visual", pa.int32()), ("visual", pa.binary()), ("prefix_ids", pa.list_(pa.int32())),
                      ("prefix_hidden", pa.binary())):
        table = table.append_column(col, pa.array([(found[s] if s else none)[col] for s in shas], kind))
    return table


def training_dataset(art: Artifacts, store: Storage, seed: int, cpus_per_task: float = 0.5):
    """A Ray Dataset over the artifacts' sample shards with their visual tokens attached. Shard
    files are read in a seeded order that changes every epoch (rows are shuffled further by the
    workers' local buffer)."""
    import ray

    fs, _ = store.arrow_fs(art.root)
    paths = [store.arrow_fs(art.shard_uri("samples", k))[1] for k in art.shards]
    ds = ray.data.read_parquet(paths, filesystem=fs, columns=TRAIN_COLUMNS, num_cpus=cpus_per_task,
                               shuffle=ray.data.FileShuffleConfig(seed=seed, reseed_after_execution=True))
    return ds.map_batches(attach_visual, batch_format="pyarrow", batch_size=None, num_cpus=cpus_per_task,
                          fn_kwargs=dict(root=art.root, owners=art.owners, storage=store.cfg,
                                         drop_unowned=bool(art.quarantined)))


def decode_rows(rows: list[dict], hidden: int, dtype: str) -> list:
    """Rows of `training_dataset` -> spec_core DraftSamples (float32 tensors)."""
    from spec_core.fovea.data import decode_sample

    return [decode_sample(r, r["visual"], r["n_visual"], hidden, dtype, r["prefix_ids"], r["prefix_hidden"]) for r in rows]
