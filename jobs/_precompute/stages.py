"""The two Ray Data stages of the precompute job.

`EncodeShard` (CPU tasks): manifest rows of one shard -> images decoded, chat template, assistant
loss mask, processor inputs; bad rows become rejects with a reason. `TargetStage` (an actor pool,
one frozen target per actor): encoded shard -> one prefill per micro-batch -> artifacts, written
and committed as one shard (jobs.lib.artifact_store). Both pass whole shards, so that a shard is
the unit of commit and of resume. A sample longer than the target's position table (the text
config's max_position_embeddings) is rejected with the reason before its prefill; with
response_source "target", so is one whose prompt at some turn plus max_new_tokens is beyond it.
"""

from __future__ import annotations

import io
import pickle
import resource
import time

import numpy as np
import pyarrow.parquet as pq

from jobs.lib.manifest_rows import encode_row, row_image
from jobs.lib.ray_setup import where_am_i
from jobs.lib.storage import Storage, StorageConfig, StorageUnavailable


class EncodeShard:
    """CPU stage: {shard, rows, owners} -> the same row plus the pickled encoded samples."""

    def __init__(self, manifest_uri: str, target_path: str, storage: StorageConfig, max_length: int | None):
        from jobs.lib.model_cache import local_model_dir
        from spec_core.targets import load_image_encoder

        self.store, self.max_length = Storage(storage), max_length
        self.manifest = pq.read_table(io.BytesIO(self.store.read_bytes(manifest_uri)))
        self.encoder = load_image_encoder(local_model_dir(target_path, storage))  # s3://: once per node

    def __call__(self, item: dict) -> dict:
        from spec_core.targets.encode import EncodeError

        t0 = time.perf_counter()
        rows = self.manifest.take(list(item["rows"]))
        samples, rejects, orphans = [], [], {}
        owners = set(item["owners"].split(",")) if item["owners"] else set()
        for row in rows.to_pylist():
            try:
                enc = encode_row(row, self.encoder, self.store, self.max_length)
            except StorageUnavailable:
                raise  # the job's, not the sample's
            except (EncodeError, ValueError, OSError) as err:
                rejects.append({"id": row["id"], "source": row.get("source"), "stage": "encode", "reason": str(err)})
                self._keep_orphan(row, owners, orphans)
                continue
            samples.append({"id": row["id"], "source": row.get("source"), "task": row.get("task"),
                            "image_sha256": row["image_sha256"], **enc})
        return {**item, "payload": pickle.dumps({"samples": samples, "rejects": rejects, "orphans": orphans}),
                "encode_seconds": time.perf_counter() - t0}


    def _keep_orphan(self, row: dict, owners: set[str], orphans: dict) -> None:
        """A rejected row whose image this shard owns: keep the image's inputs, so that its visual
        tokens are still written for the other shards' samples that use it."""
        sha = row.get("image_sha256")
        if sha in owners and sha not in orphans:
            try:
                orphans[sha] = self.encoder([row_image(row, self.store)]).arrays
            except Exception:  # noqa: BLE001 - an unreadable image fails every sample that uses it
                pass


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
    """Actor stage: one frozen target per actor; each call processes and commits whole shards.

    With response_source "target" the actor first regenerates the shard's answers (self-
    distillation) with the same frozen target it then prefills: a separate generation stage
    would hold a second copy of the weights per GPU and ship every encoded shard through the
    object store twice, and regenerating inside the shard keeps the shard the unit of commit
    (a killed run regenerates exactly the uncommitted shards; greedy answers come out the same).
    """

    def __init__(self, target_path: str, dtype: str, entropy_layers: tuple[int, int] | None,
                 hidden_dtype: str, batch_size: int, artifacts_uri: str, storage: StorageConfig, metadata: dict,
                 cpu_threads: int = 1, response_source: str = "dataset", max_new_tokens: int = 512,
                 max_length: int | None = None):
        import torch

        from jobs.lib.model_cache import local_model_dir
        from spec_core.targets import load_target

        torch.set_num_threads(max(1, cpu_threads))  # intra-op threads = the actor's CPUs
        target_path = local_model_dir(target_path, storage)  # s3://: downloaded once per node
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if self.device == "cuda" else "float32"
        self.adapter = load_target(target_path, dtype=getattr(torch, dtype), device=self.device)
        self.layers = tuple(entropy_layers) if entropy_layers else self.adapter.default_entropy_layers
        self.hidden_dtype, self.batch_size = hidden_dtype, batch_size
        self.root, self.store = artifacts_uri, Storage(storage)
        self.metadata = {k: str(v) for k, v in metadata.items()}
        self.pad_id = self.adapter.model.config.text_config.pad_token_id or 0
        self.peak_private_mb = 0.0
        self.max_positions = self.adapter.max_positions
        self.distill = (SelfDistill(self.adapter.model, target_path, max_new_tokens, self.pad_id, batch_size,
                                    max_positions=self.max_positions)
                        if response_source == "target" else None)
        self.max_length = max_length

    def _micro_batch(self, group: list[dict]) -> list[dict]:
        from spec_core.targets.artifacts import sample_artifacts
        from spec_core.targets.base import pad_left
        from spec_core.targets.encode import collate_image_inputs

        ids_BT, mask_BT = pad_left([s["input_ids"] for s in group], self.pad_id)
        batch = {"input_ids": ids_BT, "attention_mask": mask_BT, **collate_image_inputs([s["images"] for s in group])}
        out = self.adapter.prefill(batch, self.layers)
        arts = []
        for b, s in enumerate(group):
            arts.append(sample_artifacts(out, b, ids_BT, mask_BT, np.asarray(s["loss_mask"]), self.hidden_dtype))
        return arts

    def _visual_only(self, sha: str, arrays: dict) -> dict:
        """Projected visual tokens of one image without any text (its samples were rejected)."""
        import torch

        from spec_core.targets.artifacts import to_16bit
        from spec_core.targets.encode import collate_image_inputs

        batch = {k: v.to(self.adapter.model.device) for k, v in collate_image_inputs([arrays]).items()}
        with torch.no_grad():
            features_ND = self.adapter.image_features(batch).pooler_output[0]
        return {"image_sha256": sha, "n_visual": len(features_ND), "visual": to_16bit(features_ND, self.hidden_dtype).tobytes(),
                "prefix_ids": [], "prefix_hidden": b""}

    def _regenerate(self, samples: list[dict], rejects: list[dict]) -> tuple[list[dict], int]:
        """Answers replaced by the target's; samples now over max_length, or left unanswered
        because a turn would run past the position table, join the rejects."""
        samples, truncated = self.distill(samples)
        kept = []
        for s in samples:
            if s.get("reject"):
                rejects.append({"id": s["id"], "source": s["source"], "stage": "target", "reason": s["reject"]})
            elif self.max_length is not None and len(s["input_ids"]) > self.max_length:
                rejects.append({"id": s["id"], "source": s["source"], "stage": "target", "reason":
                                f"too long: {len(s['input_ids'])} tokens > max_length {self.max_length} "
                                "with the target's answers"})
            else:
                kept.append(s)
        return kept, truncated

    def _within_positions(self, samples: list[dict], rejects: list[dict]) -> list[dict]:
        """Samples whose prompt and answers fit the target's position table; the rest join the
        rejects (prefilling past it would run silently on positions the target never saw)."""
        from spec_core.targets import position_overflow

        kept = []
        for s in samples:
            reason = position_overflow(len(s["input_ids"]), 0, self.max_positions)
            if reason is None:
                kept.append(s)
            else:
                rejects.append({"id": s["id"], "source": s["source"], "stage": "target", "reason": reason})
        return kept

    def __call__(self, batch: dict) -> dict:
        from jobs.lib.artifact_store import commit_shard
        from spec_core.targets.artifacts import image_prefix_len, naive_bytes

        shards = []
        for i in range(len(batch["shard"])):
            t0 = time.perf_counter()
            data = pickle.loads(batch["payload"][i])
            owners = set(batch["owners"][i].split(",")) if batch["owners"][i] else set()
            orphans = dict(data.get("orphans", {}))
            for s in data["samples"]:  # before regeneration may reject some of them
                if s["image_sha256"] in owners:
                    orphans.setdefault(s["image_sha256"], s["images"])
            truncated, t_gen = 0, time.perf_counter()
            if self.distill is not None:
                data["samples"], truncated = self._regenerate(data["samples"], data["rejects"])
            t_gen = time.perf_counter() - t_gen
            data["samples"] = self._within_positions(data["samples"], data["rejects"])
            samples = sorted(data["samples"], key=lambda s: len(s["input_ids"]))
            rows, visual, naive, tokens = [], {}, 0, 0
            for j in range(0, len(samples), self.batch_size):
                group = samples[j: j + self.batch_size]
                for s, a in zip(group, self._micro_batch(group)):
                    sha = s["image_sha256"]
                    if sha in owners and sha not in visual:  # this sample's prefix becomes the image's
                        L = image_prefix_len(a.input_ids, self.adapter.image_token_id)
                        visual[sha] = {"image_sha256": sha, "n_visual": len(a.visual), "visual": a.visual.tobytes(),
                                       "prefix_ids": a.input_ids[:L].tolist(), "prefix_hidden": a.final_hidden[:L].tobytes()}
                    prefix = visual[sha]["prefix_ids"] if sha in visual else []
                    L = len(prefix) if a.input_ids[:len(prefix)].tolist() == prefix else 0
                    rows.append({"id": s["id"], "source": s["source"], "task": s["task"],
                                 "image_sha256": sha, "n_tokens": len(a.input_ids), "prefix_len": L,
                                 "input_ids": a.input_ids, "loss_mask": a.loss_mask,
                                 "final_hidden": a.final_hidden[L:].tobytes(), "mid_pos": a.mid_pos,
                                 "mid_layer": a.mid_layer, "mid_hidden": a.mid_hidden.tobytes()})
                    naive += naive_bytes(len(a.input_ids), len(a.visual), a.final_hidden.shape[1])
                    tokens += len(a.input_ids)
            for sha in sorted(owners - set(visual)):  # owned images none of whose samples survived
                if sha in orphans:
                    visual[sha] = self._visual_only(sha, orphans[sha])
            rows.sort(key=lambda r: r["id"])  # deterministic row order within the shard
            tables = {"samples": rows, "visual": sorted(visual.values(), key=lambda v: v["image_sha256"]),
                      "rejects": data["rejects"]}
            busy = time.perf_counter() - t0
            self.peak_private_mb = max(self.peak_private_mb, private_rss_mb())
            rec = commit_shard(self.store, self.root, int(batch["shard"][i]), tables, self.metadata, {
                "rows": [int(r) for r in batch["rows"][i]],  # the manifest rows this marker covers
                "samples": len(rows), "rejects": len(data["rejects"]), "naive_bytes": naive, "tokens": tokens,
                "reject_reasons": [r["reason"] for r in data["rejects"]], "busy_seconds": busy,
                "encode_seconds": float(batch["encode_seconds"][i]), **where_am_i(),
                "generate_seconds": t_gen, "truncated_answers": truncated,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "peak_private_mb": self.peak_private_mb,
                "finished_unix": time.time()})
            shards.append(rec["shard"])
        return {"shard": shards}  # the shard records are the commit markers, read by the driver


class SelfDistill:
    """response_source "target": every assistant span of a shard's samples replaced by the
    frozen target's greedy answer given the conversation so far, turn by turn (round r answers
    every sample's r-th turn, in micro-batches, with the answers of rounds < r already in the
    prompt). Token for token: the stored span is exactly what `generate` returned. A sample whose
    prompt at some turn plus max_new_tokens is beyond `max_positions` is not answered from that
    turn on: it comes back with the reason under "reject"."""

    def __init__(self, model, target_path: str, max_new_tokens: int, pad_id: int, batch_size: int,
                 max_positions: int | None = None):
        from transformers import GenerationConfig

        from spec_core.targets import load_image_encoder

        self.model, self.pad_id, self.batch_size = model, pad_id, batch_size
        self.max_new, self.max_positions = max_new_tokens, max_positions
        self.encoder = load_image_encoder(target_path)  # per-token inputs (Qwen: mm_token_type_ids)
        eos = model.generation_config.eos_token_id
        eos = model.config.text_config.eos_token_id if eos is None else eos
        self.stop_ids = [eos] if isinstance(eos, int) else list(eos)
        # greedy over the raw logits (what speculative verification compares against): a
        # checkpoint's own defaults such as Qwen's repetition_penalty 1.05 are overridden; an
        # image placeholder is never generated (it would need an image feature to prefill)
        self.config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, repetition_penalty=1.0,
            no_repeat_ngram_size=0, eos_token_id=self.stop_ids, pad_token_id=pad_id,
            suppress_tokens=[self.encoder.image_token_id])

    def _generate(self, prompts: list[list[int]], images: list[dict]) -> list[list[int]]:
        import torch

        from spec_core.targets.base import pad_left
        from spec_core.targets.encode import collate_image_inputs

        ids_BT, mask_BT = pad_left(prompts, self.pad_id)
        batch = {"input_ids": ids_BT, "attention_mask": mask_BT, **collate_image_inputs(images),
                 **self.encoder.token_inputs(ids_BT)}
        dtype = next(self.model.parameters()).dtype
        batch = {k: v.to(self.model.device, dtype if v.is_floating_point() else v.dtype) for k, v in batch.items()}
        with torch.no_grad():
            out_BT = self.model.generate(**batch, generation_config=self.config)
        return out_BT[:, ids_BT.shape[1]:].tolist()  # new tokens; pads after a stop are cut by splice_answer

    def __call__(self, samples: list[dict]) -> tuple[list[dict], int]:
        """-> (samples with the target's answers, answers cut by max_new_tokens)."""
        from spec_core.targets import position_overflow
        from spec_core.targets.encode import assistant_spans, splice_answer

        samples = [dict(s) for s in samples]
        truncated, turn = 0, 0
        while True:
            todo = [(i, spans[turn]) for i, s in enumerate(samples)
                    if "reject" not in s and len(spans := assistant_spans(s["loss_mask"])) > turn]
            for i, span in todo:  # checked before generating: never decoded past the table
                reason = position_overflow(span[0], self.max_new, self.max_positions)
                if reason is not None:
                    samples[i]["reject"] = f"turn {turn}: {reason}"
            todo = [(i, span) for i, span in todo if "reject" not in samples[i]]
            if not todo:
                return samples, truncated
            todo.sort(key=lambda t: t[1][0])  # similar prompt lengths together: less padding
            for j in range(0, len(todo), self.batch_size):
                group = todo[j: j + self.batch_size]
                answers = self._generate([samples[i]["input_ids"][:span[0]] for i, span in group],
                                         [samples[i]["images"] for i, _ in group])
                for (i, span), answer in zip(group, answers):
                    s = samples[i]
                    s["input_ids"], s["loss_mask"], cut = splice_answer(s["input_ids"], s["loss_mask"], span,
                                                                        answer, self.stop_ids)
                    truncated += cut
            turn += 1
