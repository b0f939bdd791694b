"""The two Ray Data stages of the precompute job.

`EncodeShard` (CPU tasks): manifest rows of one shard -> images decoded, chat template, assistant
loss mask, processor inputs; bad rows become rejects with a reason. `TargetStage` (an actor pool,
one frozen target per actor): encoded shard -> one prefill per micro-batch -> artifacts, written
and committed as one shard (jobs.lib.artifact_store). Both pass whole shards, so that a shard is
the unit of commit and of resume.
"""

from __future__ import annotations

import io
import os
import pickle
import resource
import time

import numpy as np
import pyarrow.parquet as pq

from jobs.lib.storage import Storage, StorageConfig


def _image(row: dict, store: Storage):
    from PIL import Image

    data = row["image_bytes"] if row.get("image_bytes") is not None else store.read_bytes(row["image_uri"])
    img = Image.open(io.BytesIO(data))
    img.load()
    return img.convert("RGB")


def encode_row(row: dict, processor, store: Storage, max_length: int) -> dict:
    """One manifest row -> input_ids, loss_mask and processor image inputs (raises EncodeError,
    OSError or ValueError with the reject reason)."""
    from spec_core.targets.encode import EncodeError, align_to_expanded, encode_with_mask

    tok = processor.tokenizer
    image_id = tok.convert_tokens_to_ids(processor.image_token)
    conv = [{"role": t["role"], "content": t["content"]} for t in (row["conversation"] or [])]
    ids, mask = encode_with_mask(tok, conv)
    if row.get("image_bytes") is None and not row.get("image_uri"):
        raise EncodeError("no image")
    try:
        image = _image(row, store)
    except Exception as err:  # noqa: BLE001 - any decode failure is the sample's, not the job's
        raise EncodeError(f"image unreadable: {type(err).__name__}: {err}") from None
    text = tok.apply_chat_template(conv, tokenize=False)
    inputs = processor(text=text, images=image, add_special_tokens=False, return_tensors="np")
    expanded = inputs["input_ids"][0].tolist()
    if len(expanded) > max_length:
        raise EncodeError(f"too long: {len(expanded)} tokens > max_length {max_length}")
    loss = align_to_expanded(ids, mask, expanded, image_id)
    images = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    return {"input_ids": expanded, "loss_mask": loss, "images": images}


class EncodeShard:
    """CPU stage: {shard, start, stop, owners} -> the same row plus the pickled encoded samples."""

    def __init__(self, manifest_uri: str, target_path: str, storage: dict, max_length: int):
        from transformers import AutoProcessor

        self.store, self.max_length = Storage(StorageConfig(**storage)), max_length
        self.manifest = pq.read_table(io.BytesIO(self.store.read_bytes(manifest_uri)))
        self.processor = AutoProcessor.from_pretrained(target_path, local_files_only=True)

    def __call__(self, item: dict) -> dict:
        from spec_core.targets.encode import EncodeError

        t0 = time.perf_counter()
        rows = self.manifest.slice(item["start"], item["stop"] - item["start"])
        samples, rejects = [], []
        for row in rows.to_pylist():
            try:
                enc = encode_row(row, self.processor, self.store, self.max_length)
            except (EncodeError, ValueError, OSError) as err:
                rejects.append({"id": row["id"], "source": row.get("source"), "stage": "encode", "reason": str(err)})
                continue
            samples.append({"id": row["id"], "source": row.get("source"), "task": row.get("task"),
                            "image_sha256": row["image_sha256"], **enc})
        return {**item, "payload": pickle.dumps({"samples": samples, "rejects": rejects}),
                "encode_seconds": time.perf_counter() - t0}


def private_rss_mb() -> float:
    """Resident private (anonymous) memory of this process, MB: what the process itself holds.
    ru_maxrss also counts touched pages of Ray's shared object store, which grow with the number
    of objects read, not with what the actor keeps. Falls back to ru_maxrss off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class TargetStage:
    """Actor stage: one frozen target per actor; each call processes and commits whole shards."""

    def __init__(self, target_path: str, dtype: str, entropy_layers: tuple[int, int] | None,
                 hidden_dtype: str, batch_size: int, artifacts_uri: str, storage: dict, metadata: dict,
                 cpu_threads: int = 1):
        import torch

        from spec_core.targets import load_target

        torch.set_num_threads(max(1, cpu_threads))  # intra-op threads = the actor's CPUs
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if self.device == "cuda" else "float32"
        self.adapter = load_target(target_path, dtype=getattr(torch, dtype), device=self.device)
        self.layers = tuple(entropy_layers) if entropy_layers else self.adapter.default_entropy_layers
        self.hidden_dtype, self.batch_size = hidden_dtype, batch_size
        self.root, self.store = artifacts_uri, Storage(StorageConfig(**storage))
        self.metadata = {k: str(v) for k, v in metadata.items()}
        self.pad_id = self.adapter.model.config.text_config.pad_token_id or 0
        self.peak_private_mb = 0.0

    def _micro_batch(self, group: list[dict]) -> list[dict]:
        import torch

        from spec_core.targets.artifacts import sample_artifacts
        from spec_core.targets.base import pad_left

        ids_BT, mask_BT = pad_left([s["input_ids"] for s in group], self.pad_id)
        batch = {"input_ids": ids_BT, "attention_mask": mask_BT}
        for key in group[0]["images"]:
            batch[key] = torch.from_numpy(np.concatenate([s["images"][key] for s in group]))
        out = self.adapter.prefill(batch, self.layers)
        arts = []
        for b, s in enumerate(group):
            arts.append(sample_artifacts(out, b, ids_BT, mask_BT, np.asarray(s["loss_mask"]), self.hidden_dtype))
        return arts

    def __call__(self, batch: dict) -> dict:
        from jobs.lib.artifact_store import commit_shard
        from spec_core.targets.artifacts import naive_bytes

        shards = []
        for i in range(len(batch["shard"])):
            t0 = time.perf_counter()
            data = pickle.loads(batch["payload"][i])
            owners = set(batch["owners"][i].split(",")) if batch["owners"][i] else set()
            samples = sorted(data["samples"], key=lambda s: len(s["input_ids"]))
            rows, visual, naive, tokens = [], {}, 0, 0
            for j in range(0, len(samples), self.batch_size):
                group = samples[j: j + self.batch_size]
                for s, a in zip(group, self._micro_batch(group)):
                    rows.append({"id": s["id"], "source": s["source"], "task": s["task"],
                                 "image_sha256": s["image_sha256"], "n_tokens": len(a.input_ids),
                                 "input_ids": a.input_ids, "loss_mask": a.loss_mask,
                                 "final_hidden": a.final_hidden.tobytes(), "mid_pos": a.mid_pos,
                                 "mid_layer": a.mid_layer, "mid_hidden": a.mid_hidden.tobytes()})
                    if s["image_sha256"] in owners and s["image_sha256"] not in visual:
                        visual[s["image_sha256"]] = {"image_sha256": s["image_sha256"], "n_visual": len(a.visual),
                                                     "visual": a.visual.tobytes()}
                    naive += naive_bytes(len(a.input_ids), len(a.visual), a.final_hidden.shape[1])
                    tokens += len(a.input_ids)
            rows.sort(key=lambda r: r["id"])  # deterministic row order within the shard
            tables = {"samples": rows, "visual": sorted(visual.values(), key=lambda v: v["image_sha256"]),
                      "rejects": data["rejects"]}
            busy = time.perf_counter() - t0
            self.peak_private_mb = max(self.peak_private_mb, private_rss_mb())
            rec = commit_shard(self.store, self.root, int(batch["shard"][i]), tables, self.metadata, {
                "samples": len(rows), "rejects": len(data["rejects"]), "naive_bytes": naive, "tokens": tokens,
                "reject_reasons": [r["reason"] for r in data["rejects"]], "busy_seconds": busy,
                "encode_seconds": float(batch["encode_seconds"][i]), "actor": os.getpid(),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "peak_private_mb": self.peak_private_mb,
                "finished_unix": time.time()})
            shards.append(rec["shard"])
        return {"shard": shards}  # the shard records are the commit markers, read by the driver
