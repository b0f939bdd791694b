"""jobs.lib.model_cache: a model directory on S3 is downloaded once per node into an entry keyed
by its listing, atomically (temp dir + rename, marker last) and under a lock; a changed model gets
a new entry; a half-written copy is never used; local paths pass through as before."""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.lib import model_cache
from jobs.lib.model_cache import (MARKER, fetch_model, listing, listing_key, local_model_dir, model_identity,
                                  read_model_file)
from jobs.lib.storage import Storage, join

REPO = Path(__file__).resolve().parents[3]


def untrained_target(out: Path) -> Path:
    """A tiny reference target as `build_target` saves it, without the training (seconds)."""
    from spec_core.reference.tasks import TASKS, all_words, corpus_texts, make_split
    from spec_core.reference.vlm.build import TOKENIZER_VOCAB
    from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
    from spec_core.reference.vlm.tokenizer import train_tokenizer

    samples = [s for t in TASKS for s in make_split(t, 1, 0, "train")]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(all_words())], TOKENIZER_VOCAB)
    build_vlm(PRESETS["tiny"], tok, 0).save_pretrained(out)
    build_processor(PRESETS["tiny"], tok).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return untrained_target(tmp_path_factory.mktemp("mc") / "target")


def upload(local: Path, uri: str) -> None:
    store = Storage()
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        store.write_bytes(join(uri, f.relative_to(local).as_posix()), f.read_bytes())


def snapshot(directory: str) -> dict:
    """(inode, mtime) of the directory and of every file in it: a rewrite changes them."""
    d = Path(directory)
    return {str(p.relative_to(d)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in [d, *d.rglob("*")]}


@pytest.fixture
def model(target, s3_bucket, tmp_path, monkeypatch):
    uri = f"{s3_bucket}/models/tiny"
    upload(target, uri)
    monkeypatch.setenv("SPEC_MODEL_CACHE", str(tmp_path / "cache"))
    return uri, tmp_path / "cache"


def test_downloaded_once_then_served_from_the_cache(model, target, monkeypatch, caplog):
    uri, root = model
    caplog.set_level(logging.INFO, logger="werkzeug")  # the moto server logs every request it serves
    gets = lambda: sum(f"GET /{uri[5:]}/" in r.getMessage() for r in caplog.records)  # noqa: E731
    first = fetch_model(uri, None)
    assert first.downloaded and Path(first.path).parent == root
    local_files = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert first.bytes == sum(len(b) for b in local_files.values()) and first.seconds > 0
    got = {p.relative_to(first.path).as_posix(): p.read_bytes() for p in Path(first.path).rglob("*") if p.is_file()}
    assert got == {**local_files, MARKER: got[MARKER]}
    assert json.loads(got[MARKER]) == {"uri": uri, "files": len(local_files), "bytes": first.bytes,
                                       "seconds": round(first.seconds, 3)}
    before, n_files = snapshot(first.path), gets()
    assert n_files == len(local_files)  # one GET per object

    def no_download(*a, **k):
        raise AssertionError("downloaded again")

    with monkeypatch.context() as m:  # this process: a hit never reaches the download
        m.setattr(model_cache, "_download", no_download)
        again = fetch_model(uri, None)
    assert again.path == first.path and not again.downloaded and again.bytes == 0
    code = ("import json; from jobs.lib.model_cache import fetch_model; "
            f"c = fetch_model({uri!r}, None); print(json.dumps([c.path, c.downloaded]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [first.path, False]  # another process too
    assert snapshot(first.path) == before  # nothing rewritten
    assert local_model_dir(uri, None) == first.path
    upload(target, f"{uri}-copy")  # the same content elsewhere: the same entry
    assert fetch_model(f"{uri}-copy", None).path == first.path
    assert gets() == n_files  # no object was read again, by this process or the other one


def _flock_waiters(lock: Path) -> int:
    """Processes blocked on an flock of `lock` (/proc/locks lists waiters with '->')."""
    ino = lock.stat().st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for ln in lines if "->" in ln and any(f.endswith(f":{ino}") for f in ln.split()))


def test_two_processes_on_a_node_download_once(model):
    """Both wait on the key's lock (held here until both are blocked on it); the first to get it
    downloads, the second finds the finished copy."""
    uri, root = model
    key = listing_key(listing(Storage(), uri))
    root.mkdir(parents=True)
    lock = root / f"{key}.lock"
    ctx = multiprocessing.get_context("spawn")
    with open(lock, "a") as held, ctx.Pool(2) as pool:
        fcntl.flock(held, fcntl.LOCK_EX)
        pending = pool.starmap_async(fetch_model, [(uri, None, str(root))] * 2, chunksize=1)
        deadline = time.monotonic() + 120
        while _flock_waiters(lock) < 2 and time.monotonic() < deadline and not pending.ready():
            time.sleep(0.1)
        if pending.ready():
            pending.get()  # a child failed before reaching the lock: show why
        assert _flock_waiters(lock) == 2
        fcntl.flock(held, fcntl.LOCK_UN)
        copies = pending.get(timeout=120)
    assert sorted(c.downloaded for c in copies) == [False, True]
    assert copies[0].path == copies[1].path == str(root / key)
    assert sorted(p.name for p in root.iterdir()) == sorted([key, f"{key}.lock"])  # no temp dirs left


def test_a_changed_object_gives_a_new_entry(model, target):
    uri, root = model
    old = fetch_model(uri, None)
    cfg = json.loads((target / "config.json").read_text())
    changed = json.dumps({**cfg, "note": "rebuilt"}, indent=1).encode()
    Storage().write_bytes(join(uri, "config.json"), changed)  # a new ETag
    new = fetch_model(uri, None)
    assert new.downloaded and new.path != old.path
    assert (Path(new.path) / "config.json").read_bytes() == changed
    assert (Path(old.path) / "config.json").read_bytes() == (target / "config.json").read_bytes()
    assert (Path(old.path) / MARKER).is_file() and (Path(new.path) / MARKER).is_file()


def test_a_half_written_copy_is_never_used(model, target, monkeypatch):
    uri, root = model
    key = listing_key(listing(Storage(), uri))
    crashed = root / f".tmp-{key}-deadbeef"  # a download killed half-way
    crashed.mkdir(parents=True)
    (crashed / "config.json").write_bytes(b'{"trunc')
    unmarked = root / key  # an entry without its marker
    unmarked.mkdir()
    (unmarked / "config.json").write_bytes(b'{"trunc')
    copy = fetch_model(uri, None)
    assert copy.downloaded and copy.path == str(unmarked)
    assert (unmarked / "config.json").read_bytes() == (target / "config.json").read_bytes()
    assert not crashed.exists()

    # a download that fails half-way leaves neither an entry nor its temp dir behind
    other = f"{uri}-2"
    upload(target, other)
    Storage().write_text(join(other, "extra.txt"), "another model")
    calls = []
    real = model_cache.retry_call

    def flaky(fn, op, u, *a, **k):
        if op == "read":
            calls.append(u)
            if len(calls) == 2:
                raise ConnectionError("link lost")
        return real(fn, op, u, *a, **k)

    monkeypatch.setattr(model_cache, "retry_call", flaky)
    with pytest.raises(ConnectionError, match="link lost"):
        fetch_model(other, None)
    key2 = listing_key(listing(Storage(), other))
    assert not (root / key2).exists() and not list(root.glob(f".tmp-{key2}-*"))


def test_local_paths_and_identities(target, s3_bucket, tmp_path, monkeypatch):
    from spec_core.targets import target_identity

    monkeypatch.setenv("SPEC_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(target.parent)
    assert local_model_dir("target", None) == str(target.resolve())  # as the jobs resolved it before
    assert model_identity(Storage(), "target") == target_identity("target")
    assert not (tmp_path / "cache").exists()
    uri = f"{s3_bucket}/t"
    upload(target, uri)
    assert model_identity(Storage(), uri) == {**target_identity(target), "target_path": uri}
    assert read_model_file(Storage(), uri, "config.json") == (target / "config.json").read_bytes()
    assert read_model_file(Storage(), uri, "nope.json") is None
    assert read_model_file(Storage(), str(target), "nope.json") is None
    assert not (tmp_path / "cache").exists()  # identities read config.json only
    with pytest.raises(FileNotFoundError, match="no config.json"):
        model_identity(Storage(), f"{s3_bucket}/empty")
    with pytest.raises(FileNotFoundError, match="holds no objects"):
        fetch_model(f"{s3_bucket}/empty", None)


def test_a_directory_no_job_can_use_is_one_line_on_the_driver(target, s3_bucket, tmp_path):
    """Invalid config.json, a plain LM (no image path), a config with no weights, local or on
    S3: ModelDirError naming the directory and what is wrong, before any worker starts."""
    from transformers import LlamaConfig

    bad_json, lm, bare = tmp_path / "bad_json", tmp_path / "lm", tmp_path / "bare"
    bad_json.mkdir()
    (bad_json / "config.json").write_text('{"model_type": "llava",')
    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                vocab_size=64).save_pretrained(lm)
    (lm / "model.safetensors").write_bytes(b"")
    bare.mkdir()
    (bare / "config.json").write_bytes((target / "config.json").read_bytes())
    cases = {bad_json: "config.json is not valid JSON", lm: "holds a 'llama' model, not a supported VLM target",
             bare: "has a config.json but no weights (*.safetensors or *.bin)"}
    for local, what in cases.items():
        uri = f"{s3_bucket}/dirs/{local.name}"
        upload(local, uri)
        for where in (str(local), uri):
            with pytest.raises(model_cache.ModelDirError) as e:
                model_identity(Storage(), where)
            assert str(e.value).startswith(f"target {where}") and what in str(e.value) and "\n" not in str(e.value)
