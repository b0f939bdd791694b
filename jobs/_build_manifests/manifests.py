"""Dataset manifests: sources (Parquet, JSONL, JSON, `datasets` saved to disk; local or s3://)
-> a decontaminated training pool and one evaluation table per source, as Parquet.

A manifest YAML (manifests/datasets/*.yaml) lists sources with field mappings (see
jobs._build_manifests.sources) and a split policy. `build` writes into <out>:

    train.parquet           every source's training rows (manifest order, then split order)
    eval/<source>.parquet   one evaluation manifest per source that has an evaluation part
    rejects.parquet         rows left out, with id and "kind: detail" reason (REJECT_SCHEMA)
    manifest_report.json    counts per source, dropped counts by reason, the overlap check; last

Split policies (FOVEA Appendix B):
  random      sklearn `train_test_split(rows, train_size=n_train,
              test_size=min(n_eval_max, n - n_train), random_state=seed)`, reproduced exactly
              by `shuffle_split`; rows in neither part are unused.
  official    per-split files (`uri: {train: ..., test: ...}`; for an hf_disk DatasetDict folder
              the key names its split) or a split column; the train part optionally capped to
              n_train by `cap_train` (the same sklearn semantics).
  eval_only   every row is evaluation.    train_only   every row is training, optional cap.
A split runs over the source's rows in file order (after `where` and `text_only: skip`) before
any row is parsed, so the partition is a function of the source alone: an unreadable row leaves
a hole (a reject) instead of shifting the others. `decontaminate` then drops training rows whose
id or image sha256 appears in ANY evaluation row - the whole pool, not only the general one as the
paper words it - and `overlap` must be zero afterwards; ids are compared across sources, hence
each source's `id_prefix`. A cap is drawn before decontamination (never refilled), so a capped
part can end below its n_train; the report says by how many and why.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal, NamedTuple
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import Field, ValidationError, model_validator

from jobs.lib.config import ConfigError, Strict, config_hash
from jobs._build_manifests.sources import (ERROR_KEY, Conversation, ImageSpec, Uris, conversation_fields,
                                       expand_uris, has_image, read_file, read_image,
                                       with_image_token)
from jobs.lib.checksums import file_record
from jobs.lib.records import TURN
from jobs.lib.storage import Storage, join

# One row per sample. Exactly one of image_uri / image_bytes is set (a reference or embedded
# bytes, as the source has them); image_sha256 is always the hex sha256 of the image bytes.
MANIFEST_SCHEMA = pa.schema([
    ("id", pa.string()),              # official id with the source's id_prefix; unique per source
    ("source", pa.string()),          # the source's name in the manifest
    ("split", pa.string()),           # "train" | "eval"
    ("task", pa.string()),            # category / task kind, nullable
    ("image_uri", pa.string()),       # storage URI of the image file, nullable
    ("image_bytes", pa.binary()),     # embedded encoded image, nullable
    ("image_sha256", pa.string()),
    ("conversation", pa.list_(TURN)),  # {role: user|assistant, content}; turn 0: user, "<image>\n..."
])
# stage: "read" (the mapping could not read the row) or "decontaminate" (a dropped training row);
# row: the position in the source, "<split file key>-<n>" for per-split files.
REJECT_SCHEMA = pa.schema([("source", pa.string()), ("split", pa.string()), ("row", pa.string()),
                           ("id", pa.string()), ("stage", pa.string()), ("reason", pa.string())])
SPLIT_SEED = 42  # the paper's random_state


class SourceError(ValueError):
    """A source that cannot be built at all (no file, a file that does not parse, too few rows for
    its split); `str()` is one line naming the source. Row-level problems are rejects instead."""


# ---------------------------------------------------------------- the manifest spec

class OfficialSplit(Strict):
    policy: Literal["official"]
    field: str | None = None  # a column naming each row's split; None: per-split files (`uri` mapping)
    train_values: list[str] = ["train"]
    eval_values: list[str] = ["test"]
    n_train: int | None = Field(None, ge=1)  # cap on the official train part
    seed: int = SPLIT_SEED


class RandomSplit(Strict):
    policy: Literal["random"]
    n_train: int = Field(1000, ge=1)
    n_eval_max: int = Field(3000, ge=1)
    seed: int = SPLIT_SEED


class EvalOnly(Strict):
    policy: Literal["eval_only"]


class TrainOnly(Strict):
    policy: Literal["train_only"]
    n_train: int | None = Field(None, ge=1)  # cap, e.g. the general pool's 51,671
    seed: int = SPLIT_SEED


Split = Annotated[OfficialSplit | RandomSplit | EvalOnly | TrainOnly, Field(discriminator="policy")]
Scalar = str | int | float | bool


class SourceSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    format: Literal["parquet", "jsonl", "json", "hf_disk"]
    uri: Uris | dict[str, Uris]  # files or globs; a mapping {split name: files} = official splits
    id_field: str | None = "id"  # None: the row's position in the source
    id_prefix: str = ""          # ids are compared across sources: keep numbering schemes apart
    image: ImageSpec = ImageSpec()
    conversation: Conversation
    task_field: str | None = None
    task: str | None = None      # constant task when there is no task_field
    where: dict[str, Scalar | list[Scalar]] = {}  # keep rows whose field equals (one of) the value(s)
    text_only: Literal["reject", "skip"] = "reject"  # skip: leave image-less rows out before the split
    split: Split

    @model_validator(mode="after")
    def _split_files(self) -> SourceSpec:
        per_split, sp = isinstance(self.uri, dict), self.split
        if per_split and not (isinstance(sp, OfficialSplit) and sp.field is None):
            raise ValueError("a per-split 'uri' mapping needs split.policy official without split.field")
        if isinstance(sp, OfficialSplit) and not per_split and sp.field is None:
            raise ValueError("split.policy official needs split.field or a per-split 'uri' mapping")
        unknown = set(self.uri) - set(sp.train_values) - set(sp.eval_values) if per_split else set()
        if unknown:
            raise ValueError(f"uri keys {sorted(unknown)} are in neither split.train_values "
                             "nor split.eval_values")
        return self

    def columns(self) -> set[str]:
        split_field = self.split.field if isinstance(self.split, OfficialSplit) else None
        cols = {self.id_field, self.image.field, self.task_field, split_field, *self.where}
        return {c for c in cols | conversation_fields(self.conversation) if c}


class DatasetManifest(Strict):
    name: str
    description: str = ""
    vars: dict[str, str] = {}  # defaults for ${NAME} (the environment and the job's vars win)
    sources: list[SourceSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> DatasetManifest:
        dup = sorted(n for n, k in Counter(s.name for s in self.sources).items() if k > 1)
        if dup:
            raise ValueError(f"source names must be unique, repeated: {dup}")
        return self


class _Manifests(Strict):
    manifests: list[DatasetManifest]


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(node: Any, values: dict[str, str], uri: str) -> Any:
    if isinstance(node, dict):
        return {k: _expand(v, values, uri) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand(v, values, uri) for v in node]
    if not isinstance(node, str):
        return node

    def sub(m: re.Match) -> str:
        if m.group(1) not in values:
            raise ConfigError(f"config error: manifest {uri} uses ${{{m.group(1)}}}, which is not set "
                              "(set it in the environment, the manifest's vars or the job's vars)")
        return values[m.group(1)]
    return _VAR.sub(sub, node)


def load_manifest(uri: str, job_vars: dict[str, str] | None = None,
                  store: Storage | None = None) -> DatasetManifest:
    """Read a manifest YAML (any storage URI), expand ${NAME} (job vars > environment > the
    manifest's vars) and validate it; any problem is a one-line ConfigError naming field and file."""
    store = store or Storage()
    if not store.exists(uri):
        raise ConfigError(f"config error: manifest {uri} does not exist")
    try:
        data = yaml.safe_load(store.read_text(uri)) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"config error: manifest {uri}{f' line {mark.line + 1}' if mark else ''} "
                          "is not valid YAML") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config error: manifest {uri} must hold a mapping at the top level")
    defaults = data.get("vars") if isinstance(data.get("vars"), dict) else {}
    values = {**{k: str(v) for k, v in defaults.items()}, **os.environ, **(job_vars or {})}
    body = _expand({k: v for k, v in data.items() if k != "vars"}, values, uri)
    body["vars"] = data.get("vars", {})
    try:
        return DatasetManifest.model_validate(body)
    except ValidationError as err:
        raise ConfigError(_error_line(err, body, uri)) from None


def _error_line(err: ValidationError, data: dict, uri: str) -> str:
    """Like jobs.lib.config's line, but an unknown field (a typo) is named before the 'missing'
    error it usually causes, and a source is named by its name too."""
    first = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc, more = first["loc"], f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    where = "'" + (".".join(str(p) for p in loc) or "<root>") + "'"
    srcs = data.get("sources") if len(loc) > 1 and loc[0] == "sources" else None
    if isinstance(srcs, list) and isinstance(loc[1], int) and loc[1] < len(srcs) \
            and isinstance(srcs[loc[1]], dict) and "name" in srcs[loc[1]]:
        where += f" (source '{srcs[loc[1]]['name']}')"
    if first["type"] == "extra_forbidden":
        return (f"config error: unknown field {where} in manifest {uri}: "
                f"not a field of a dataset manifest{more}")
    return f"config error: invalid value {where} in manifest {uri}: {first['msg']}{more}"


def spec_hash(manifests: list[DatasetManifest]) -> str:
    """Stable hash of the resolved manifests: what the output depends on besides the data."""
    return config_hash(_Manifests(manifests=manifests))


# ---------------------------------------------------------------- splits (sklearn semantics)

def shuffle_split(n: int, n_train: int, n_test: int, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices exactly as sklearn's `train_test_split(range(n), train_size=n_train,
    test_size=n_test, random_state=seed)`: its ShuffleSplit draws
    `np.random.RandomState(seed).permutation(n)`, the test part is the first n_test entries and
    the train part the next n_train, both in permutation order (sklearn is not a dependency)."""
    if n_train < 1 or n_test < 0 or n_train + n_test > n:
        raise ValueError(f"cannot split {n} rows into {n_train} train + {n_test} eval")
    perm = np.random.RandomState(seed).permutation(n)
    return perm[n_test:n_test + n_train], perm[:n_test]


def random_split(n: int, n_train: int, n_eval_max: int,
                 seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The paper's 'n_train rows to training and up to n_eval_max of the rest to evaluation'."""
    if n <= n_train:
        raise ValueError(f"a random split needs more than n_train={n_train} rows, the source has {n}")
    return shuffle_split(n, n_train, min(n_eval_max, n - n_train), seed)


def cap_train(n: int, n_train: int | None, seed: int = SPLIT_SEED) -> np.ndarray:
    """n_train of n rows as `train_test_split(range(n), train_size=n_train, random_state=seed)`
    picks its train part (the last n_train of the permutation); all rows, in order, if n <= n_train."""
    if n_train is None or n <= n_train:
        return np.arange(n)
    return shuffle_split(n, n_train, n - n_train, seed)[0]


class Pick(NamedTuple):
    split: str    # "train" | "eval"
    row: str      # position in the source
    rec: dict


def _where(rec: dict, where: dict) -> bool:
    return all(rec.get(k) in v if isinstance(v, list) else rec.get(k) == v for k, v in where.items())


def select(src: SourceSpec, groups: dict[str, list[dict]]) -> tuple[list[Pick], list[dict], Counter]:
    """Filter the records and apply the split policy -> (picked rows, rejects, counts)."""
    counts: Counter = Counter()
    rows: list[tuple[str, str, dict]] = []  # (group, row, record)
    for group, recs in groups.items():
        for i, rec in enumerate(recs):
            counts["records"] += 1
            if ERROR_KEY not in rec and not _where(rec, src.where):
                counts["filtered_out"] += 1
            elif src.text_only == "skip" and ERROR_KEY not in rec and not has_image(rec.get(src.image.field)):
                counts["text_only_skipped"] += 1
            else:
                rows.append((group, f"{group}-{i}" if group else str(i), rec))
    sp, rejects = src.split, []
    if isinstance(sp, RandomSplit):
        tr, ev = random_split(len(rows), sp.n_train, sp.n_eval_max, sp.seed)
        train, evals = [rows[i] for i in tr], [rows[i] for i in ev]
    elif isinstance(sp, EvalOnly):
        train, evals = [], rows
    elif isinstance(sp, TrainOnly):
        train, evals = [rows[i] for i in cap_train(len(rows), sp.n_train, sp.seed)], []
    else:
        labelled = [(g if sp.field is None else r.get(sp.field), (g, row, r)) for g, row, r in rows]
        for label, (_, row, r) in labelled:
            if label is None:
                reason = r.get(ERROR_KEY) or f"missing split: no value in '{sp.field}'"
                rejects.append({"source": src.name, "row": row, "stage": "read", "reason": reason})
        pool = [x for label, x in labelled if label is not None and str(label) in sp.train_values]
        evals = [x for label, x in labelled if label is not None and str(label) in sp.eval_values]
        train = [pool[i] for i in cap_train(len(pool), sp.n_train, sp.seed)]
    counts.update(unused=len(rows) - len(train) - len(evals) - len(rejects),
                  picked_train=len(train), picked_eval=len(evals))
    picks = [Pick("train", row, r) for _, row, r in train] + [Pick("eval", row, r) for _, row, r in evals]
    return picks, rejects, counts


# ---------------------------------------------------------------- rows, decontamination, build

def map_row(pick: Pick, src: SourceSpec, store: Storage) -> dict:
    """One picked record -> a manifest row (plus its `_row`), or a reject with a reason."""
    base = {"source": src.name, "split": pick.split, "_row": pick.row}
    rec = pick.rec
    if ERROR_KEY in rec:
        return {**base, "reason": rec[ERROR_KEY]}
    raw_id = pick.row if src.id_field is None else rec.get(src.id_field)
    if raw_id is None or str(raw_id) == "":
        return {**base, "reason": f"missing id: no value in '{src.id_field}'"}
    base["id"] = f"{src.id_prefix}{raw_id}"
    turns = src.conversation.turns(rec)
    turns = turns if isinstance(turns, str) else with_image_token(turns)
    if isinstance(turns, str):
        return {**base, "reason": turns}
    image = read_image(rec.get(src.image.field), src.image, store)
    if isinstance(image, str):
        return {**base, "reason": image}
    task = rec.get(src.task_field) if src.task_field else src.task
    return {**base, "task": None if task is None else str(task), "image_uri": image[0],
            "image_bytes": image[1], "image_sha256": image[2], "conversation": turns}


class SourceResult(NamedTuple):
    train: list[dict]
    eval: list[dict]
    rejects: list[dict]
    counts: Counter


def _reject(row: dict, stage: str) -> dict:
    return {"source": row["source"], "split": row.get("split"), "row": row.get("_row", row.get("row")),
            "id": row.get("id"), "stage": stage, "reason": row["reason"]}


def build_source(src: SourceSpec, store: Storage, workers: int = 8,
                 progress: Callable | None = None) -> SourceResult:
    """Read, split and map one source; images are read on `workers` threads, order is kept."""
    cols, files = src.columns(), source_files(src, store)
    try:
        groups = {g: [r for f in fs for r in read_file(src.format, f, store, cols, g or None)]
                  for g, fs in files.items()}
        picks, rejects, counts = select(src, groups)
    except ValueError as err:  # a file that does not parse, too few rows for the split
        raise SourceError(f"source '{src.name}': {err}") from None
    rejects = [_reject({**r, "split": None}, "read") for r in rejects]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        mapped = pool.map(lambda p: map_row(p, src, store), picks)
        rows = list(progress(mapped, len(picks), src.name) if progress else mapped)
    out: dict[str, list[dict]] = {"train": [], "eval": []}
    seen: dict[tuple[str, str], str] = {}
    for row in rows:
        first = seen.setdefault((row["split"], row.get("id")), row["_row"]) if "reason" not in row else None
        if first is not None and first != row["_row"]:
            row = {**row, "reason": f"duplicate id: also at row {first}"}
        if "reason" in row:
            rejects.append(_reject(row, "read"))
        else:
            out[row["split"]].append(row)
    counts.update(f"rejected {r['reason'].split(':')[0]}" for r in rejects)
    return SourceResult(out["train"], out["eval"], rejects, counts)


def source_files(src: SourceSpec, store: Storage) -> dict[str, list[str]]:
    """{group: files}; the group is the split name for per-split files, '' otherwise."""
    groups = src.uri if isinstance(src.uri, dict) else {"": src.uri}
    try:
        return {g: expand_uris(store, u) for g, u in groups.items()}
    except ValueError as err:
        raise SourceError(f"source '{src.name}': {err}") from None


def decontaminate(train: list[dict], evals: list[dict]) -> tuple[list[dict], list[dict]]:
    """Drop training rows whose id or image_sha256 appears in any evaluation row ->
    (kept, dropped); a dropped row carries `reason` ('id in eval: ...' or 'image in eval: ...')."""
    by_id = {r["id"]: r for r in reversed(evals)}  # reversed: the first match is named
    by_sha = {r["image_sha256"]: r for r in reversed(evals)}
    kept, dropped = [], []
    for r in train:
        if r["id"] in by_id:
            dropped.append({**r, "reason": f"id in eval: {by_id[r['id']]['source']}"})
        elif r["image_sha256"] in by_sha:
            hit = by_sha[r["image_sha256"]]
            dropped.append({**r, "reason": f"image in eval: {hit['source']} {hit['id']}"})
        else:
            kept.append(r)
    return kept, dropped


def overlap(train: list[dict], evals: list[dict]) -> dict[str, int]:
    """How many training ids / image hashes also occur in the evaluation rows."""
    return {k: len({r[k] for r in train} & {r[k] for r in evals}) for k in ("id", "image_sha256")}


def write_parquet(store: Storage, uri: str, rows: list[dict], schema: pa.Schema) -> dict:
    """Write the rows; returns the file's record (size, sha256) for the build's report."""
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    store.write_bytes(uri, buf.getvalue())
    return file_record(buf.getvalue())


def build(manifests: list[DatasetManifest], out: str, store: Storage | None = None,
          workers: int = 8, progress: Callable[[Iterable, int, str], Iterable] | None = None) -> dict:
    """Every source -> split, mapped rows -> decontaminated train pool + eval manifests -> <out>.
    Nothing is written until every source has been read; the report is written last."""
    store = store or Storage()
    sources = [s for m in manifests for s in m.sources]
    dup = sorted(n for n, k in Counter(s.name for s in sources).items() if k > 1)
    if dup:
        raise ConfigError(f"config error: source names must be unique across manifests, repeated: {dup}")
    for s in sources:
        source_files(s, store)  # every source's files exist before any is read
    results = {s.name: build_source(s, store, workers, progress) for s in sources}
    evals = [r for res in results.values() for r in res.eval]
    train, dropped = decontaminate([r for res in results.values() for r in res.train], evals)
    after = overlap(train, evals)
    assert after == {"id": 0, "image_sha256": 0}, after

    store.delete(join(out, "manifest_report.json"))  # the marker of a finished build goes first
    store.delete(join(out, "eval"), recursive=True)
    files = {"train": "train.parquet", "rejects": "rejects.parquet", "eval": {}}
    checksums = {files["train"]: write_parquet(store, join(out, files["train"]), train, MANIFEST_SCHEMA)}
    for s in sources:
        if not isinstance(s.split, TrainOnly):
            files["eval"][s.name] = rel = f"eval/{s.name}.parquet"
            checksums[rel] = write_parquet(store, join(out, rel), results[s.name].eval, MANIFEST_SCHEMA)
    rejects = [r for res in results.values() for r in res.rejects]
    rejects += [_reject(r, "decontaminate") for r in dropped]
    checksums[files["rejects"]] = write_parquet(store, join(out, files["rejects"]), rejects, REJECT_SCHEMA)
    # the report is the build's marker: each file's size and sha256, which the jobs reading a
    # manifest check before use (jobs.lib.manifest_rows.check_manifest)
    report = {**make_report(manifests, sources, results, train, dropped, after, files), "checksums": checksums}
    store.write_text(join(out, "manifest_report.json"), json.dumps(report, indent=2, sort_keys=True))
    return report


def make_report(manifests, sources, results, train, dropped, after, files) -> dict:
    """Counts per source (records, split parts, rejects and drops by reason) and totals."""
    kept = Counter(r["source"] for r in train)
    drops: dict[str, Counter] = {s.name: Counter() for s in sources}
    for r in dropped:
        drops[r["source"]][r["reason"].split(":")[0]] += 1
    per = {}
    for s in sources:
        res = results[s.name]
        per[s.name] = {**dict(res.counts), "policy": s.split.policy, "train": kept[s.name],
                       "eval": len(res.eval), "dropped": dict(drops[s.name]),
                       "rejected": len(res.rejects)}
    total_drops = sum(drops.values(), Counter())
    return {"spec_hash": spec_hash(manifests), "manifests": [m.name for m in manifests],
            "sources": per, "files": files, "overlap_after_decontamination": after,
            "totals": {"train": len(train), "eval": sum(len(r.eval) for r in results.values()),
                       "rejected": sum(len(r.rejects) for r in results.values()),
                       "dropped": dict(total_drops)}}
