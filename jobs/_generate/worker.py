"""The generate job's actor: one frozen target and the drafters of the compared methods; each call
decodes one shard of an evaluation manifest with every method and commits it.

Per shard: manifest rows -> encoded conversations (jobs.lib.manifest_rows.encode_row; a bad
image is a reject with its reason; a user turn without an answer - MMSpec's `turns`, consecutive
user prompts - gets a stand-in answer, `with_answer_slots`) -> for each sample, each method in turn
(interleaved, so that drift of a shared machine hits every method alike) answers every user turn
at batch 1 with the conversation so far (earlier turns hold that method's own answers; a turn
whose prompt is over max_length, or whose prompt plus max_new_tokens is beyond the target's
position table, is a reject with its reason and ends that sample's conversation) ->
then, for each batch size > 1, the same turn prompts as one request stream through a continuous-
batching engine of that size (throughput; outputs checked against batch 1 when greedy) -> tables
committed with a marker (jobs.lib.artifact_store), so a rerun skips the shard.

Engines are built once per actor (method, batch size), sized for max_length + max_new_tokens, and
warmed up on their first use with a request that is not timed (a compiled engine first compiles
every shape its steps can take: `DecodeEngine.warm_up`, `HFEngine.warm_up`). A goodput policy
lives as long as the actor too, per (method, batch size): an engine rebuilt after a failed
request takes over what the old one learnt, and each shard's report holds its own share of the
policy's counts (the difference of its cumulative stats).
"""

from __future__ import annotations

import io
import time
import zlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.lib.ray_setup import where_am_i
from jobs.lib.storage import Storage, StorageConfig, StorageUnavailable
from spec_core.decoding.goodput import GoodputPolicy
from spec_core.decoding.tree import TreeConfig

RESPONSES_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("task", pa.string()), ("turn", pa.int32()),
    ("method", pa.string()),
    ("response", pa.string()),                    # decoded, special tokens dropped
    ("response_ids", pa.list_(pa.int32())),       # exactly the generated tokens, through EOS
    ("finished_by", pa.string()),                 # eos | length
    ("target_path", pa.string()), ("target_config_sha256", pa.string()),
])
METRICS_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("task", pa.string()), ("turn", pa.int32()),
    ("method", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("new_tokens", pa.int32()),
    ("steps", pa.int32()),                        # target forwards after the prefill
    ("tau", pa.float64()),                        # committed tokens per step, bonus included
    ("mat", pa.float64()),                        # accepted draft tokens per step (tau - 1)
    ("prefill_s", pa.float64()), ("decode_s", pa.float64()), ("latency_s", pa.float64()),
    ("tokens_per_s", pa.float64()),
    ("accept_lengths", pa.list_(pa.int32())),     # tokens committed per step, bonus included
    ("visual_shares", pa.list_(pa.float32())),    # per step, with generation.track_visual (else empty)
])
REJECTS_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("method", pa.string()), ("turn", pa.int32()),
    ("stage", pa.string()), ("reason", pa.string()),
])
KINDS = {"responses": RESPONSES_SCHEMA, "metrics": METRICS_SCHEMA, "rejects": REJECTS_SCHEMA}


@dataclass(frozen=True)
class MethodPlan:
    """One compared method as the actor needs it (built from the job config)."""

    name: str
    drafter: str | None            # None: autoregressive
    visual_correction: bool = True
    tree: TreeConfig = TreeConfig()       # the draft tree (its policy: fixed | goodput, spec_core.decoding.goodput)
    correction_depth: int | None = None   # None: as the drafter was trained
    proposer: str | None = None           # a training-free method: pld | sam | lookahead | recycling
    params: dict | None = None            # its parameters (None: MMSpec's defaults)
    viskip: float | None = None           # ViSkip threshold (None: off)
    hf: bool = False                      # HF `generate` itself (static padded batches), the users' baseline
    compile: bool | None = None           # compiled steps (hf: HF's fast path); None: the job's compute.compile


def _seed(base: int, sample_id: str, turn: int) -> int:
    return (base * 1_000_003 + zlib.crc32(f"{sample_id}/{turn}".encode())) % 2**63


class GenerateWorker:
    def __init__(self, target_path: str, target_identity: dict, methods: list[MethodPlan],
                 storage: StorageConfig, out_uri: str, *, dtype: str = "auto", max_length: int = 2048,
                 max_new_tokens: int = 256, batch_sizes: tuple[int, ...] = (1,), sampling: dict | None = None,
                 seed: int = 0, cpu_threads: int = 1, track_visual: bool = False, metadata: dict | None = None,
                 compile: str = "auto", compile_cache: str | None = None):
        import torch

        from jobs.lib.job import compile_enabled, use_compile_cache

        from jobs.lib.model_cache import local_model_dir
        from spec_core.decoding import SamplingConfig, load_drafter
        from spec_core.targets import load_target
        from spec_core.targets import load_image_encoder

        torch.set_num_threads(max(1, cpu_threads))
        target_path = local_model_dir(target_path, storage)  # s3://: downloaded once per node
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = ("bfloat16" if self.device == "cuda" else "float32") if dtype == "auto" else dtype
        self.adapter = load_target(target_path, dtype=getattr(torch, dtype), device=self.device)
        self.encoder = load_image_encoder(target_path)
        self.identity, self.methods = target_identity, methods
        self.drafters = {m.drafter: load_drafter(local_model_dir(m.drafter, storage), self.adapter)
                         .to(self.device, getattr(torch, dtype)).eval()
                         for m in methods if m.drafter is not None}
        self.store, self.out = Storage(storage), out_uri
        self.manifests: dict[str, pa.Table] = {}
        self.max_length, self.max_new = max_length, max_new_tokens
        self.max_positions = self.adapter.max_positions
        self.batch_sizes = tuple(batch_sizes)
        self.sampling = SamplingConfig(**(sampling or {}))
        self.seed, self.metadata = seed, {k: str(v) for k, v in (metadata or {}).items()}
        eos = self.adapter.model.generation_config.eos_token_id
        eos = self.adapter.text_config.eos_token_id if eos is None else eos
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.engines: dict[tuple[str, int], object] = {}
        self.policies: dict[tuple[str, int], GoodputPolicy] = {}  # goodput's learnt state, for the actor's life
        self.track_visual = track_visual
        self.compile = compile_enabled(compile)
        if compile_cache:
            use_compile_cache(compile_cache)
        self.peak_state: dict[str, int] = {}
        self.gpu_peak: dict[str, int] = {}

    # --- engines ---------------------------------------------------------------------------------
    def _engine(self, method: MethodPlan, batch: int, warm_inputs: dict):
        import torch

        from spec_core.decoding import DecodeEngine, Request
        from spec_core.decoding.engine import step_scratch

        key = (method.name, batch)
        if key not in self.engines and method.hf:
            from spec_core.decoding.hf_engine import HFEngine

            engine = HFEngine(self.adapter, batch_size=batch, sampling=self.sampling, eos_token_ids=self.eos,
                              generator=torch.Generator(device=self.device).manual_seed(self.seed),
                              compile=self._compiles(method, batch))
            engine.warm_up(Request(warm_inputs, min(8, self.max_new)))  # not timed (compiled: its graphs)
            engine.phase_s = dict.fromkeys(engine.phase_s, 0.0)
            self.engines[key] = engine
        if key not in self.engines:
            tree = method.tree
            drafter = self.drafters.get(method.drafter) if method.drafter else None
            proposer = None
            if method.proposer:
                from spec_core.decoding.proposers import proposer_factory

                proposer = proposer_factory(method.proposer, self.adapter.lm_head.weight.shape[0], **(method.params or {}))
            speculative = drafter is not None or proposer is not None
            graphs = self._compiles(method, batch) and self.device == "cuda"  # token buckets: more scratch
            capacity = self.max_length + self.max_new + step_scratch(tree, speculative, graphs) + 1
            gen = torch.Generator(device=self.device).manual_seed(self.seed)
            engine = DecodeEngine(self.adapter, drafter, batch_size=batch, capacity=capacity, tree=tree,
                                  sampling=self.sampling, eos_token_ids=self.eos, generator=gen,
                                  visual_correction=method.visual_correction,
                                  correction_depth=method.correction_depth, proposer=proposer,
                                  viskip=method.viskip, track_visual=self.track_visual and batch == 1,
                                  compile=self._compiles(method, batch), policy=self.policies.get(key))
            if engine.policy is not None:
                self.policies[key] = engine.policy
            if engine.compile:  # every compiled shape now, not inside timed requests (decoding.warmup)
                engine.warm_up(Request(warm_inputs, min(8, self.max_new)))
            list(engine.generate([Request(warm_inputs, min(8, self.max_new))]))  # warm-up, not timed
            engine.phase_s = dict.fromkeys(engine.phase_s, 0.0)
            self.engines[key] = engine
        return self.engines[key]

    def _compiles(self, method: MethodPlan, batch: int) -> bool:
        """Whether a method's engine at this batch size compiles: its own setting, else the job's;
        never with ViSkip or visual tracking (a hook re-runs attention eagerly)."""
        wanted = self.compile if method.compile is None else method.compile
        return wanted and method.viskip is None and not (self.track_visual and batch == 1)

    def _inputs(self, ids: list[int], images: dict) -> dict:
        import torch

        from spec_core.targets.encode import collate_image_inputs

        ids_1T = torch.tensor([ids], dtype=torch.long)
        batch = {"input_ids": ids_1T, "attention_mask": torch.ones_like(ids_1T), **collate_image_inputs([images]),
                 **self.encoder.token_inputs(ids_1T)}
        dtype = next(self.adapter.model.parameters()).dtype
        return {k: v.to(self.device, dtype if v.is_floating_point() else v.dtype) for k, v in batch.items()}

    # --- one sample, one method, turn by turn ----------------------------------------------------
    def _conversation(self, method: MethodPlan, sample: dict, out: dict) -> list[dict]:
        """Answer every turn at batch 1, each answer in the next turn's prompt; returns the turn
        prompts (for throughput)."""
        import torch

        from spec_core.decoding import Request
        from spec_core.targets import position_overflow
        from spec_core.targets.encode import assistant_spans, splice_answer

        ids, mask = sample["input_ids"], sample["loss_mask"]
        prompts = []
        for turn in range(len(assistant_spans(mask))):
            span = assistant_spans(mask)[turn]
            prompt = ids[: span[0]]
            base = {"id": sample["id"], "source": sample["source"], "method": method.name, "turn": turn}
            reason = (f"too long: prompt of {len(prompt)} tokens > max_length {self.max_length}"
                      if len(prompt) > self.max_length else
                      position_overflow(len(prompt), self.max_new, self.max_positions))
            if reason is not None:  # before decoding: never past the position table, silently
                out["rejects"].append({**base, "stage": "decode", "reason": reason})
                return prompts
            inputs = self._inputs(prompt, sample["images"])
            engine = self._engine(method, 1, inputs)
            engine.gen.manual_seed(_seed(self.seed, sample["id"], turn))
            if self.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            try:
                seed = _seed(self.seed, sample["id"], turn)  # keys the sampled draws (same tokens at any batch)
                (res,) = engine.generate([Request(inputs, self.max_new, (sample["id"], turn), seed)])
            except (ValueError, RuntimeError) as err:  # a prompt the target cannot take: this sample's
                out["rejects"].append({**base, "stage": "decode", "reason": f"{type(err).__name__}: {err}"})
                del self.engines[(method.name, 1)]  # a step may have failed half-way: a fresh engine
                return prompts
            if self.device == "cuda":
                self.gpu_peak[method.name] = max(self.gpu_peak.get(method.name, 0), torch.cuda.max_memory_allocated())
            self.peak_state[method.name] = max(self.peak_state.get(method.name, 0), engine.state_bytes())
            answer = res.sequences[0].tolist()
            prompts.append({"key": (sample["id"], turn), "inputs": inputs, "answer": answer, "seed": seed})
            self._record(out, sample, method, turn, prompt, res)
            ids, mask, _ = splice_answer(ids, mask, span, answer, self.eos)
        return prompts

    def _record(self, out: dict, sample: dict, method: MethodPlan, turn: int, prompt: list[int], res) -> None:
        answer = res.sequences[0].tolist()
        steps = res.steps
        tau = sum(res.accept_lengths) / steps if steps else None
        latency = res.prefill_s + res.decode_s
        common = {"id": sample["id"], "source": sample["source"], "task": sample["task"], "turn": turn,
                  "method": method.name}
        out["responses"].append({**common, "response": self.encoder.tokenizer.decode(answer, skip_special_tokens=True),
                                 "response_ids": answer, "finished_by": res.finished_by,
                                 "target_path": self.identity.get("target_path"),
                                 "target_config_sha256": self.identity.get("target_config_sha256")})
        out["metrics"].append({**common, "prompt_tokens": len(prompt), "new_tokens": len(answer), "steps": steps,
                               "tau": tau, "mat": None if tau is None else tau - 1, "prefill_s": res.prefill_s,
                               "decode_s": res.decode_s, "latency_s": latency,
                               "tokens_per_s": len(answer) / latency if latency > 0 else None,
                               "accept_lengths": list(res.accept_lengths), "visual_shares": list(res.visual_shares)})

    # --- throughput at batch sizes > 1 ----------------------------------------------------------
    def _throughput(self, method: MethodPlan, prompts: list[dict], batch: int) -> dict:
        from spec_core.decoding import Request

        if not prompts:
            return {"tokens": 0, "seconds": 0.0, "mismatches": 0}
        requests = [Request(p["inputs"], self.max_new, p["key"], p["seed"]) for p in prompts]
        engine = self._engine(method, batch, requests[0].inputs)
        engine.gen.manual_seed(self.seed)
        t0 = time.perf_counter()
        results = list(engine.generate(requests))
        seconds = time.perf_counter() - t0
        self.peak_state[method.name] = max(self.peak_state.get(method.name, 0), engine.state_bytes())
        want = {p["key"]: p["answer"] for p in prompts}
        # keyed draws: a batch samples each request's batch-1 tokens too (HF's own sampling does not)
        checked = not (self.sampling.do_sample and method.hf)
        mismatches = sum(r.sequences[0].tolist() != want[r.key] for r in results) if checked else 0
        return {"tokens": sum(r.sequences.shape[1] for r in results), "seconds": seconds, "mismatches": mismatches}

    # --- one shard -------------------------------------------------------------------------------
    def _encode(self, rows: list[dict]) -> tuple[list[dict], list[dict]]:
        from jobs.lib.manifest_rows import encode_row
        from spec_core.targets.encode import EncodeError, with_answer_slots

        samples, rejects = [], []
        for row in rows:
            conv = with_answer_slots(list(row.get("conversation") or []))  # stand-ins the methods replace
            try:
                enc = encode_row({**row, "conversation": conv}, self.encoder, self.store, None)
            except StorageUnavailable:
                raise  # the job's, not the sample's
            except (EncodeError, ValueError, OSError) as err:
                rejects.append({"id": row.get("id"), "source": row.get("source"), "method": None, "turn": None,
                                "stage": "encode", "reason": str(err)})
                continue
            samples.append({"id": row["id"], "source": row.get("source"), "task": row.get("task") or row.get("source"),
                            **enc})
        return samples, rejects

    def __call__(self, item: dict) -> dict:
        import json

        from jobs.lib.artifact_store import commit_shard, marker_uri

        marker = marker_uri(self.out, int(item["shard"]))
        if self.store.exists(marker):  # a retry of a call whose actor died after the commit
            return json.loads(self.store.read_text(marker))

        t0 = time.perf_counter()
        phases0 = {k: dict(e.phase_s) for k, e in self.engines.items()}
        policy0 = {k: p.stats() for k, p in self.policies.items()}
        if item["manifest"] not in self.manifests:
            self.manifests[item["manifest"]] = pq.read_table(io.BytesIO(self.store.read_bytes(item["manifest"])))
        rows = self.manifests[item["manifest"]].take(list(item["rows"])).to_pylist()
        samples, rejects = self._encode(rows)
        out = {"responses": [], "metrics": [], "rejects": rejects}
        prompts: dict[str, list[dict]] = {m.name: [] for m in self.methods}
        for sample in samples:
            for method in self.methods:
                prompts[method.name] += self._conversation(method, sample, out)
        throughput = {m.name: {} for m in self.methods}
        for batch in self.batch_sizes:
            for method in self.methods:
                if batch == 1:  # the batch-1 pass above: its decode time is the throughput time
                    mine = [r for r in out["metrics"] if r["method"] == method.name]
                    throughput[method.name]["1"] = {"tokens": sum(r["new_tokens"] for r in mine),
                                                    "seconds": sum(r["latency_s"] for r in mine), "mismatches": 0}
                else:
                    throughput[method.name][str(batch)] = self._throughput(method, prompts[method.name], batch)
        for (name, batch), engine in self.engines.items():  # seconds per phase this shard
            if str(batch) in throughput[name]:
                before = phases0.get((name, batch), {})
                throughput[name][str(batch)]["phases"] = {p: v - before.get(p, 0.0) for p, v in engine.phase_s.items()}
                if (name, batch) in self.policies:  # goodput: its choices and fit, this shard
                    now, was = self.policies[(name, batch)].stats(), policy0.get((name, batch), {})
                    throughput[name][str(batch)]["policy"] = {k: v - was.get(k, 0) if k in GoodputPolicy.ADDITIVE else v
                                                              for k, v in now.items()}
        compiled: dict[str, dict] = {}  # per method and batch size, over the actor's life (steps compile once)
        for (name, batch), engine in self.engines.items():
            compiled.setdefault(name, {})[str(batch)] = engine.compile_stats()
        record = {"rows": list(item["rows"]),  # the manifest rows this marker covers
                  "compile": compiled,
                  "samples": len(samples), "rejects": len(out["rejects"]), "throughput": throughput,
                  "state_bytes": dict(self.peak_state), "gpu_peak_bytes": dict(self.gpu_peak),
                  "busy_seconds": time.perf_counter() - t0, **where_am_i(),
                  "finished_unix": time.time()}
        return commit_shard(self.store, self.out, int(item["shard"]), out, self.metadata, record, KINDS)
