"""The generate_images job's actor: one generator; each call generates one shard of prompts with
every method and window and commits item by item.

An item is (prompt, method, window, seed). It is committed by writing its image (PNG) or video
(GIF) and then its record, <run>/items/<key>.json: a rerun lists the records and skips those items,
so a killed job loses at most the items in flight and duplicates none (the noise is keyed on
(seed, prompt index, position), so a redone item is the same item). A prompt that cannot be
generated (empty, over-long, unknown words, a kind the generator has no model for) gets
<run>/rejects/<id>.json with the reason and the batch goes on.

Per shard and seed, prompts go in batches of `batch_size`, and within a batch every configuration
runs in turn (interleaved, so drift of a shared machine hits every method alike). Each
configuration is warmed up once per actor on an untimed sample.
"""

from __future__ import annotations

import io
import json
import time
import zlib
from dataclasses import dataclass, field

from jobs.lib.checksums import file_record, mismatch
from jobs.lib.ray_setup import where_am_i
from jobs.lib.storage import Storage, StorageConfig, join

COUPLING = {"ar": "none", "sjd": "none", "scd_mc": "mc", "scd_gs": "gs"}


@dataclass(frozen=True)
class ImagePlan:
    """What every prompt is generated with (built from the job config)."""

    methods: tuple[str, ...]
    windows: dict[str, tuple[int | str, ...]]  # kind (image | video) -> windows L (or "auto")
    seeds: tuple[int, ...]
    ar_extra_seeds: tuple[int, ...]           # AR only: the noise floor of the quality check
    sampling: dict                            # temperature, top_k, top_p, cfg_scale (None: default)
    alpha: float = 1.0
    batch_size: int = 1
    auto_max: dict = field(default_factory=lambda: {"image": 64, "video": 128})  # kind -> largest L of auto
    calibration_prompts: int = 8              # auto: batches of prompts its windows race on (at most)

    def configs(self, kind: str, seed: int) -> list[tuple[str, int | str]]:
        """(method, window) pairs run at this seed; AR has window 1."""
        if seed not in self.seeds:  # an extra AR seed
            return [("ar", 1)] if "ar" in self.methods else []
        return [(m, 1) if m == "ar" else (m, w) for m in self.methods
                for w in ((1,) if m == "ar" else self.windows[kind])]


def item_key(sample_id: str, method: str, window: int | str, seed: int) -> str:
    return f"{sample_id}__{method}__L{window}__s{seed}"


def prompt_key(sample_id: str) -> int:
    """Noise stream of a prompt: the same whatever shard or batch it lands in."""
    return zlib.crc32(sample_id.encode())


class ImageWorker:
    def __init__(self, generator_path: str, storage: StorageConfig, run_uri: str, plan: ImagePlan,
                 cpu_threads: int = 1, metadata: dict | None = None, compile: str = "auto",
                 compile_cache: str | None = None):
        import torch

        from jobs.lib.job import compile_enabled, use_compile_cache
        from jobs.lib.model_cache import local_model_dir
        from spec_core.reference.generator import load_generator
        from spec_core.scd.adapters.reference import ReferenceGenerator

        torch.set_num_threads(max(1, cpu_threads))
        self.bundle = load_generator(local_model_dir(generator_path, storage))  # s3://: once per node
        if torch.cuda.is_available():
            for lm in (self.bundle.image_lm, self.bundle.video_lm):
                if lm is not None:
                    lm.to("cuda")
        self.lms = {kind: ReferenceGenerator(self.bundle, video=kind == "video")
                    for kind, m in (("image", self.bundle.image_lm), ("video", self.bundle.video_lm))
                    if m is not None}
        self.store, self.run_uri, self.plan = Storage(storage), run_uri, plan
        self.metadata = metadata or {}
        self.compile = compile_enabled(compile)  # the Jacobi window forward as a compiled step
        if compile_cache:
            use_compile_cache(compile_cache)
        self.warm: set[tuple] = set()
        self.choosers: dict[tuple, object] = {}  # (kind, method) -> WindowChooser of window auto

    def _scd(self, kind: str, method: str, window: int | str):
        from spec_core.scd import ScdConfig

        d = self.bundle.default_sampling.to_dict() | {k: v for k, v in self.plan.sampling.items() if v is not None}
        return ScdConfig(window=window, max_window=self.plan.auto_max[kind], coupling=COUPLING[method],
                         alpha=self.plan.alpha, temperature=d["temperature"], top_k=d["top_k"],
                         top_p=d["top_p"], cfg_scale=d["cfg_scale"])

    def check(self, row: dict) -> str | None:
        """Why this prompt cannot be generated (None if it can)."""
        kind = row.get("kind") or "image"
        if kind not in ("image", "video"):
            return f"unknown kind {kind!r} (expected image or video)"
        if kind not in self.lms:
            return f"this generator has no {kind} model"
        return self.lms[kind].check_prompt(row.get("prompt") or "")

    def _run(self, kind: str, method: str, window: int | str, rows: list[dict], seed: int, keys: list[int]):
        from spec_core.scd import JacobiDecoder

        lm = self.lms[kind]
        cfg = self._scd(kind, method, window)
        cond, uncond = lm.prompts([r["prompt"] for r in rows], cfg.cfg)
        chooser = None
        if cfg.auto:  # one per actor and (kind, method): the warm-up calibrates it
            chooser = self.choosers.setdefault((kind, method), self._chooser(kind, method))
        return JacobiDecoder(lm, lm.layout(), cfg, chooser, compile=self.compile).run(cond, uncond, seed, keys)

    def _chooser(self, kind: str, method: str):
        from spec_core.scd import WindowChooser

        return WindowChooser(self.plan.auto_max[kind])

    def _warm_up(self, kind: str, method: str, window: int | str, rows: list[dict]) -> None:
        """First use of a configuration (allocations, kernels, caches) on an untimed sample; under
        window auto, the chooser's paired calibration (spec_core.scd.window.calibrate): the windows
        that could win race on the same prompts and seeds (this shard's, batch_size at a time, up
        to windows.calibration_prompts batches), then the fastest is locked."""
        if (kind, method, window) in self.warm:
            return
        self._run(kind, method, window, rows[:1], 7919, [0])
        if window == "auto" and self.choosers[(kind, method)].locked is None:
            from spec_core.scd import calibrate

            # a fresh chooser: the first run's times are cold (allocations, first calls)
            chooser = self.choosers[(kind, method)] = self._chooser(kind, method)
            size = self.plan.batch_size
            g = size * (2 if self._scd(kind, method, window).cfg else 1)
            starts = list(range(0, len(rows), size)) or [0]

            def run(L: int, p: int) -> float:  # batch p (cycling with a new seed past the shard's)
                batch = rows[starts[p % len(starts)]:][:size]
                res = self._run(kind, method, window, batch, 7919 + p, list(range(len(batch))))
                return res.prefill_s + res.loop_s

            L, times = calibrate(chooser, g, run, self.plan.calibration_prompts)
            raced = ", ".join(f"L {c}: {sum(t) / len(t):.3f} s x {len(t)}" for c, t in sorted(times.items()))
            print(f"window auto, {kind} {method}: locked L {L} (mean seconds per calibration batch: {raced})")
        self.warm.add((kind, method, window))

    def _media(self, kind: str, tokens_BN) -> list[tuple[bytes, object]]:
        """Encoded PNG / GIF bytes and the decoded pixels per sample."""
        out = []
        for x in self.lms[kind].decode(tokens_BN):
            buf = io.BytesIO()
            if kind == "video":
                x[0].save(buf, format="GIF", save_all=True, append_images=x[1:], duration=150, loop=0)
            else:
                x.save(buf, format="PNG")
            out.append((buf.getvalue(), x))
        return out

    def _commit(self, kind: str, method: str, window: int | str, seed: int, rows: list[dict], res,
                media: list[tuple[bytes, object]], e2e_s: float) -> None:
        from spec_core.reference.drawing import dominant_colour
        from spec_core.scd.quality import image_features, video_features

        feats = (video_features if kind == "video" else image_features)([m[1] for m in media])
        ext = "gif" if kind == "video" else "png"
        for b, r in enumerate(rows):
            rel = f"media/{method}_L{window}/{r['id']}_s{seed}.{ext}"
            self.store.write_bytes(join(self.run_uri, rel), media[b][0])
            commits = res.committed[b]
            follows = None
            if r.get("colour") and r.get("background"):  # the prompt's largest object's colour dominates
                first = media[b][1][0] if kind == "video" else media[b][1]
                follows = dominant_colour(first, r["background"]) == r["colour"]
            steps = max(1, len(commits) - 1)
            record = {
                "id": r["id"], "kind": kind, "prompt": r["prompt"], "method": method, "window": window,
                "seed": seed, "tokens": int(res.tokens_BN.shape[1]), "nfe": int(res.nfe_B[b]),
                "mean_committed": (sum(commits) - 1) / steps,   # tokens per iteration after the prefill
                "mean_window": res.mean_window(b),              # L per iteration (auto: the chosen ones)
                "committed": commits, "entropy": float(res.entropy_B[b]),
                "latency_s": res.prefill_s + res.loop_s, "e2e_s": e2e_s, "batch_size": len(rows),
                "peak_bytes": res.peak_bytes, "media": rel, "features": feats[b].tolist(),
                "media_file": file_record(media[b][0]),
                "background": r.get("background"), "colour": r.get("colour"), "follows": follows,
                **where_am_i(), **self.metadata,
            }
            self.store.write_text(join(self.run_uri, "items", item_key(r["id"], method, window, seed) + ".json"),
                                  json.dumps(record))

    def _committed(self, key: str, done: set[str]) -> bool:
        """Whether item `key` has a record whose media file matches it (size and sha256). One that
        does not (a truncated or swapped file, an unreadable record, a record without checksums) is
        said in one line and its record deleted, so that the item is redone."""
        if key not in done:
            return False
        uri = join(self.run_uri, "items", key + ".json")
        try:
            rec = json.loads(self.store.read_text(uri))
            why = mismatch(self.store, join(self.run_uri, rec["media"]), rec["media"], rec["media_file"])
        except (ValueError, KeyError, TypeError):
            why = "its record is unreadable or has no checksum"
        if why is None:
            return True
        print(f"item {key} does not match its record ({why}): redoing it", flush=True)
        self.store.delete(uri)
        done.discard(key)
        return False

    def __call__(self, shard: dict) -> dict:
        t0 = time.perf_counter()
        done = {n[:-5] for n in self.store.list(join(self.run_uri, "items")) if n.endswith(".json")}
        rejected = {n[:-5] for n in self.store.list(join(self.run_uri, "rejects")) if n.endswith(".json")}
        good, new_items, rejects = [], 0, 0
        for row in shard["rows"]:
            reason = self.check(row)
            if reason is None:
                good.append(row)
            elif row["id"] not in rejected:
                self.store.write_text(join(self.run_uri, "rejects", f"{row['id']}.json"),
                                      json.dumps({"id": row["id"], "prompt": row.get("prompt"),
                                                  "kind": row.get("kind"), "reason": reason}))
                rejects += 1
        for kind in ("image", "video"):
            rows = [r for r in good if (r.get("kind") or "image") == kind]
            for seed in self.plan.seeds + self.plan.ar_extra_seeds:
                for s in range(0, len(rows), self.plan.batch_size):
                    batch = rows[s:s + self.plan.batch_size]
                    for method, window in self.plan.configs(kind, seed):
                        todo = [r for r in batch if not self._committed(item_key(r["id"], method, window, seed), done)]
                        if not todo:
                            continue
                        self._warm_up(kind, method, window, rows)
                        # end to end: prompt encoding, the sampling loop, decoding to pixels, PNG / GIF
                        tb = time.perf_counter()
                        res = self._run(kind, method, window, todo, seed, [prompt_key(r["id"]) for r in todo])
                        media = self._media(kind, res.tokens_BN)
                        e2e_s = time.perf_counter() - tb
                        self._commit(kind, method, window, seed, todo, res, media, e2e_s)
                        new_items += len(todo)
        return {"shard": shard["shard"], "items": new_items, "rejects": rejects,
                "busy_seconds": time.perf_counter() - t0, **where_am_i()}
