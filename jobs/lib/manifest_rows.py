"""A manifest row -> the target's inputs: its image decoded, its conversation encoded with the
image placeholders expanded (precompute encodes training rows, generate encodes prompts)."""

from __future__ import annotations

import io

from jobs.lib.storage import Storage, StorageUnavailable


class ManifestError(ValueError):
    """A manifest a job cannot read rows from; str() is the one line."""


def check_manifest(store: Storage, uri: str, columns: tuple[str, ...]) -> int:
    """On the driver, from the Parquet footer alone: `uri` is a Parquet file holding `columns` and
    an image column (image_bytes or image_uri), with rows. Returns its row count; ManifestError
    (one line) otherwise."""
    import pyarrow.parquet as pq

    fs, path = store.arrow_fs(uri)
    try:
        meta = pq.read_metadata(path, filesystem=fs)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
        raise ManifestError(f"manifest {uri} is not a readable Parquet file ({(str(err).splitlines() or [''])[0]})") from None
    names = set(meta.schema.to_arrow_schema().names)
    missing = [c for c in columns if c not in names] + ([] if {"image_bytes", "image_uri"} & names
                                                         else ["image_bytes or image_uri"])
    if missing:
        raise ManifestError(f"manifest {uri} lacks the columns {', '.join(missing)} (jobs/build_manifests.py writes them)")
    if meta.num_rows == 0:
        raise ManifestError(f"manifest {uri} has no rows")
    if why := _differs_from_its_build(store, uri):
        raise ManifestError(f"manifest {uri} is not the file jobs/build_manifests.py wrote ({why}): "
                            "rebuild it with data.force=true")
    return meta.num_rows


def _differs_from_its_build(store: Storage, uri: str) -> str | None:
    """What differs between a manifest and the size and sha256 that the build which wrote it
    recorded (its manifest_report.json, beside it or one folder up); None where they match or no
    build recorded the file (a user's own Parquet)."""
    import json

    from jobs.lib.checksums import mismatch

    parts = uri.rstrip("/").split("/")
    for up in (1, 2):
        report = "/".join(parts[:-up] + ["manifest_report.json"])
        if store.exists(report):
            rel = "/".join(parts[-up:])
            want = json.loads(store.read_text(report)).get("checksums", {}).get(rel)
            return mismatch(store, uri, rel, want) if want else None
    return None


def row_image(row: dict, store: Storage):
    """A manifest row's image (inline bytes or its URI), decoded to RGB."""
    from PIL import Image

    data = row["image_bytes"] if row.get("image_bytes") is not None else store.read_bytes(row["image_uri"])
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB")


def encode_row(row: dict, encoder, store: Storage, max_length: int | None) -> dict:
    """One manifest row -> input_ids (placeholders expanded), loss_mask and the target's image
    arrays: one path for every target, its image inputs from `encoder` (chosen by the target's
    config class). Raises EncodeError, OSError or ValueError with the reject reason; max_length
    None skips the length check (the target stage checks after regenerating answers)."""
    from spec_core.targets.encode import MANIFEST_IMAGE, EncodeError, encode_with_mask, expand_image_tokens

    conv = [{"role": t["role"], "content": t["content"].replace(MANIFEST_IMAGE, encoder.image_text)
             if isinstance(t["content"], str) else t["content"]} for t in (row["conversation"] or [])]
    ids, mask = encode_with_mask(encoder.tokenizer, conv)
    if row.get("image_bytes") is None and not row.get("image_uri"):
        raise EncodeError("no image")
    try:
        image = row_image(row, store)
    except StorageUnavailable:
        raise  # the job's, not the sample's: it stops and reruns, the sample is not rejected
    except Exception as err:  # noqa: BLE001 - any decode failure is the sample's, not the job's
        raise EncodeError(f"image unreadable: {type(err).__name__}: {err}") from None
    images = encoder([image])
    ids, mask = expand_image_tokens(ids, mask, encoder.image_token_id, images.counts)
    if max_length is not None and len(ids) > max_length:
        raise EncodeError(f"too long: {len(ids)} tokens > max_length {max_length}")
    return {"input_ids": ids, "loss_mask": mask, "images": images.arrays}
