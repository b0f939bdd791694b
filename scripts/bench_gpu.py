"""Decoding speed on GPU-sized targets with random weights: HF `generate` (eager, and its static
cache + compiled decode), the engine's AR (eager and compiled) and compiled goodput speculation
with a random-init drafter, per batch size. Built in code (no downloads).

    python scripts/bench_gpu.py --out /tmp/gpu_bench.json                  # CUDA, bf16, batch 1 / 8 / 32
    python scripts/bench_gpu.py --size 7b --batch 1 --batch 8 --out /tmp/gpu_bench_7b.json
    python scripts/bench_gpu.py --device cpu --size tiny --batch 1 --batch 2 --max-new 8 --reps 1

Targets: `gpu`, a `LlavaForConditionalGeneration` of the reference architecture (CLIP tower, MLP
projector, Llama decoder) with TinyLlama's decoder shape (hidden 2048, 22 layers, 32 heads, 4 KV
heads, ~1.1 B parameters) and LLaVA-1.5's vocabulary (32064; image token 32000), a small CLIP
tower (224 px, patch 14: 256 image tokens); `7b`, a `LlavaNextForConditionalGeneration` with
Vicuna-7B's decoder (hidden 4096, 32 layers, 32 heads, ~6.7 B parameters), AnyRes on one 224 px
tile (528 image tokens); `tiny`, a few-MB LLaVA for CPU runs. Weights are initialised on the device.
Drafter: an untrained FOVEA drafter (one block), so speculation accepts little: the goodput
policy should fall back towards AR, and the figure bounds what speculation costs when drafts miss.

Greedy, a fixed number of new tokens (EOS off on every side), one request per slot (`batch`
requests, prompts of different lengths: HF left-pads). Sides are interleaved per repetition
after one warm-up repetition (compiles, and calibrates the goodput policy; its seconds are the
compile cost), the minimum and the median of each are reported (a VM's host is noisy; a
launch-bound decode is paid on the host).
Per batch, printed and written as it ends: ms per generated token, and as a multiple of the
bandwidth limit (the decoder's and LM head's weight bytes / the device's measured copy bandwidth,
per step, over the batch's tokens); the eager sides' overhead share, step time outside the
target's language-model forwards (hooks synchronized on CUDA; a hook would break a compiled
graph, so compiled sides have none); the token-mismatch rate against HF (position-wise; in bf16
greedy outputs may differ where logits tie within rounding, in fp32 they must not) and the
fraction of sequences that differ; speculation's tokens per step and the goodput policy's mean
nodes per step; the compiled engine's verify step of a 40-node tree over its AR step.
--profile adds, per batch, one more pass of each side under torch.profiler: kernel launches
(CUDA graph replays counted as launches), aten ops and host waits on the device per token, and
the operators with the most host time. Writes every figure to --out as JSON; prints a table.
With --device cuda and no CUDA: prints 'skipped: no CUDA' and exits 0 (the JSON then says so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,  # noqa: E402
                          LlavaNextConfig, LlavaNextForConditionalGeneration)

from bench_batch import ForwardTimer  # noqa: E402
from spec_core.decoding import DecodeEngine, Request, TreeConfig  # noqa: E402
from spec_core.decoding.compiled import mark_dynamic, mark_keys  # noqa: E402
from spec_core.decoding.engine import step_scratch  # noqa: E402
from spec_core.decoding.hf_engine import HFEngine  # noqa: E402
from spec_core.fovea import FoveaDrafter  # noqa: E402
from spec_core.targets import adapter_for  # noqa: E402

# text (Llama), vision (CLIP), image token, prompt words before / after the image (ranges)
SIZES = {
    "gpu": dict(text=dict(vocab_size=32064, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                          num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048),
                vision=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                            image_size=224, patch_size=14, projection_dim=512),
                image_token=32000, before=(8, 24), after=(16, 48), drafter=dict(n_blocks=1)),
    "tiny": dict(text=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
                 vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             image_size=32, patch_size=8, projection_dim=32),
                 image_token=255, before=(2, 6), after=(4, 10), drafter=dict(n_blocks=1, k_min=2, k_max=8)),
    "7b": dict(text=dict(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
               vision=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                           image_size=224, patch_size=14, projection_dim=512),
               image_token=32000, before=(8, 24), after=(16, 48), drafter=dict(n_blocks=1), anyres=[[224, 224]]),
}
PAD, BOS = 0, 1


def build_target(size: str, device: str, dtype: torch.dtype):
    """The random-weight target (seeded), initialised directly on `device` in `dtype`: a LLaVA, or
    a LLaVA-NeXT where the size has AnyRes pinpoints."""
    s = SIZES[size]
    common = dict(vision_config=CLIPVisionConfig(**s["vision"]),
                  text_config=LlamaConfig(**s["text"], pad_token_id=PAD, bos_token_id=BOS, eos_token_id=2),
                  image_token_index=s["image_token"], vision_feature_layer=-1,
                  vision_feature_select_strategy="default", projector_hidden_act="gelu")
    cls, config = ((LlavaNextForConditionalGeneration, LlavaNextConfig(**common, image_grid_pinpoints=s["anyres"]))
                   if "anyres" in s else (LlavaForConditionalGeneration, LlavaConfig(**common)))
    torch.manual_seed(0)
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None  # fixed length: every side decodes max_new tokens
    model.generation_config.pad_token_id = PAD
    return model.eval().requires_grad_(False)


def image_inputs(model, size: str, g: torch.Generator) -> tuple[dict, int]:
    """One random image's model inputs and its number of visual tokens (asked of the model: LLaVA-NeXT's
    count follows its AnyRes layout)."""
    s = SIZES[size]
    px = s["vision"]["image_size"]
    if "anyres" not in s:
        return {"pixel_values": torch.randn(1, 3, px, px, generator=g)}, (px // s["vision"]["patch_size"]) ** 2
    inputs = {"pixel_values": torch.randn(1, 2, 3, px, px, generator=g), "image_sizes": torch.tensor([[px, px]])}
    with torch.no_grad():
        feats = model.model.get_image_features(**{k: v.to(model.device, model.dtype if v.is_floating_point() else v.dtype)
                                                  for k, v in inputs.items()}).pooler_output
    return inputs, int(feats[0].shape[0])


def make_requests(model, size: str, n: int, max_new: int, seed: int = 0) -> list[Request]:
    """n one-image prompts: BOS, random words, the expanded image placeholder, random words."""
    s, g = SIZES[size], torch.Generator().manual_seed(seed)
    vocab = s["image_token"]  # words below the image token
    out = []
    for i in range(n):
        lo, hi = s["before"]
        before = int(torch.randint(lo, hi + 1, (1,), generator=g))
        lo, hi = s["after"]
        after = int(torch.randint(lo, hi + 1, (1,), generator=g))
        words = lambda k: torch.randint(3, vocab, (k,), generator=g).tolist()  # noqa: E731
        image, n_image = image_inputs(model, size, g)
        ids = [BOS] + words(before) + [s["image_token"]] * n_image + words(after)
        out.append(Request({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                            **image}, max_new, key=i))
    return out


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """The device's measured copy bandwidth, bytes per second (a copy reads and writes each byte)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def decode_weight_bytes(model) -> int:
    """Bytes a decoding step reads: the text decoder's and the LM head's weights (the vision tower
    and projector run at prefill only)."""
    lm = model.model.language_model
    embed = {id(p) for p in lm.embed_tokens.parameters()}  # rows gathered, not read whole
    params = {id(p): p for p in lm.parameters() if id(p) not in embed}
    params.update({id(p): p for p in model.get_output_embeddings().parameters()})
    return sum(p.numel() * p.element_size() for p in params.values())


def mismatch_rate(ref: list[list[int]], out: list[list[int]]) -> float:
    """Fraction of token positions where `out` differs from `ref` (sequences of equal lengths;
    a missing token counts as a mismatch)."""
    total = sum(max(len(a), len(b)) for a, b in zip(ref, out))
    same = sum(x == y for a, b in zip(ref, out) for x, y in zip(a, b))
    return (total - same) / max(total, 1)


class SyncedForwardTimer(ForwardTimer):
    """ForwardTimer that waits for the device at both hooks: on CUDA a forward returns once its
    kernels are queued, so unsynchronized hooks would time only the launches."""

    def __init__(self, module: torch.nn.Module, sync):
        self._sync = sync
        super().__init__(module)

    def _start(self, *args):
        self._sync()
        super()._start(*args)

    def _stop(self, *args):
        self._sync()
        super()._stop(*args)


SIDES = ("hf", "hf_compiled", "engine_ar", "engine_ar_compiled", "speculative")  # speculative: goodput, compiled
EAGER = ("hf", "engine_ar")  # sides whose forwards are timed by hooks (a hook would break a compiled graph)


def run(engine, adapter, reqs: list[Request], sync, time_forwards: bool) -> dict:
    """One pass over the requests: outputs in request order, wall (and forward) seconds, steps."""
    timer = SyncedForwardTimer(adapter.model.model.language_model, sync) if time_forwards else None
    sync()
    t0 = time.perf_counter()
    results = sorted(engine.generate(reqs), key=lambda r: r.key)
    sync()
    dt = time.perf_counter() - t0
    if timer is not None:
        timer.close()
    return {"out": [r.sequences[0].tolist() for r in results], "seconds": dt,
            "forward": timer.seconds if timer else None,
            "steps": sum(r.steps for r in results), "tokens": sum(r.sequences.shape[1] for r in results)}


def engines_at(adapter, drafter, b: int, cap: int, tree: TreeConfig) -> dict:
    return {"hf": HFEngine(adapter, batch_size=b), "hf_compiled": HFEngine(adapter, batch_size=b, compile=True),
            "engine_ar": DecodeEngine(adapter, None, batch_size=b, capacity=cap),
            "engine_ar_compiled": DecodeEngine(adapter, None, batch_size=b, capacity=cap, compile=True),
            "speculative": DecodeEngine(adapter, drafter, batch_size=b, capacity=cap, tree=tree, compile=True)}


def bench_batch(adapter, drafter, size: str, b: int, args, sync, step_limit_s: float) -> dict:
    """Every side at batch b, interleaved; figures of the fastest repetition of each.
    step_limit_s: seconds one decoding step takes at the bandwidth limit (its weights read once)."""
    reqs = make_requests(adapter.model, size, b, args.max_new, seed=b)
    tree = TreeConfig(policy="goodput")
    scratch = step_scratch(tree, True, args.device.startswith("cuda"))
    cap = max(r.inputs["input_ids"].shape[1] for r in reqs) + args.max_new + scratch + 1
    engines = engines_at(adapter, drafter, b, cap, tree)
    runs: dict[str, list[dict]] = {k: [] for k in engines}
    warm: dict[str, float] = {}
    for rep in range(args.reps + 1):  # repetition 0: compiles, and the goodput policy's calibration
        for name, engine in engines.items():
            r = run(engine, adapter, reqs, sync, name in EAGER)
            if rep:
                runs[name].append(r)
            else:
                warm[name] = round(r["seconds"], 2)
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    tokens = b * args.max_new
    ref = best["hf"]["out"]
    limit_ms = 1e3 * step_limit_s / b  # per generated token: a step reads the weights once for b tokens
    fig = {"requests": b, "prompt_tokens": [int(r.inputs["input_ids"].shape[1]) for r in reqs],
           "bandwidth_limit_ms_per_token": round(limit_ms, 4), "warmup_s": warm}
    for name, r in best.items():
        ms = 1e3 * r["seconds"] / tokens
        fig[name] = {"ms_per_token": round(ms, 4), "x_bandwidth_limit": round(ms / limit_ms, 2),
                     "median_ms_per_token": round(1e3 * statistics.median(x["seconds"] for x in runs[name]) / tokens, 4),
                     "overhead_share": None if r["forward"] is None else round(1 - r["forward"] / r["seconds"], 4),
                     "seconds": [round(x["seconds"], 4) for x in runs[name]]}
        if hasattr(engines[name], "compile_stats") and name not in EAGER:
            fig[name]["compile"] = engines[name].compile_stats()
        if name != "hf":
            fig[name]["mismatch_vs_hf"] = round(mismatch_rate(ref, r["out"]), 4)
            fig[name]["sequences_differ_vs_hf"] = round(sum(a != o for a, o in zip(ref, r["out"])) / b, 4)
            fig[name]["time_vs_hf"] = round(r["seconds"] / best["hf"]["seconds"], 4)
            fig[name]["median_time_vs_hf"] = round(fig[name]["median_ms_per_token"] / fig["hf"]["median_ms_per_token"], 4)
    spec, ar = best["speculative"], best["engine_ar_compiled"]
    fig["speculative"]["tokens_per_step"] = round((spec["tokens"] - b) / max(spec["steps"], 1), 3)  # first: prefill
    fig["speculative"]["mismatch_vs_engine_ar"] = round(mismatch_rate(ar["out"], spec["out"]), 4)
    fig["speculative"]["time_vs_engine_ar"] = round(spec["seconds"] / ar["seconds"], 4)
    chosen = engines["speculative"].policy.chosen
    fig["speculative"]["goodput_nodes_per_step"] = round(sum(chosen) / max(len(chosen), 1), 2)
    fig["verify40_over_ar_step"] = round(verify_over_ar(engines["engine_ar_compiled"], reqs, sync), 3)
    if args.profile:
        fig["profile"] = {name: profile(engines[name], adapter, reqs, sync, tokens, name in EAGER) for name in engines}
    return fig


def verify_over_ar(engine: DecodeEngine, reqs: list[Request], sync, nodes: int = 40, reps: int = 20) -> float:
    """The compiled target step over [root, `nodes` tree nodes] per slot against the same step over
    the root alone (an AR step), each timed over `reps` calls after one untimed (a CUDA graph's
    recording) - the price of verifying a tree on this device."""
    engine._admit(list(enumerate(reqs[: engine.B])))  # every slot holds a prompt
    times = {}
    for S in (1, engine.buckets.tokens(1 + nodes)):
        K = engine.buckets.keys(max(engine.len_host) + S, engine.capacity)
        ids = torch.zeros(engine.B, S, dtype=torch.long, device=engine.device)
        depth = torch.arange(S, device=engine.device).expand(engine.B, S).contiguous()
        anc = torch.ones(S, S, dtype=torch.bool, device=engine.device).tril().expand(engine.B, S, S).contiguous()
        for i in range(reps + 1):  # call 0: untimed
            if i == 1:
                sync()
                t0 = time.perf_counter()
            engine._target_step(engine.buckets.shape("target", engine.B, S, K), engine.adapter, engine.tcache,
                                mark_dynamic(ids, 1), mark_dynamic(depth, 1), engine.tpos_B, engine.len_B,
                                mark_dynamic(anc, 1, 2), mark_keys(engine._keys_C[:K]), engine.mrope, caller=engine)
        sync()
        times[S] = time.perf_counter() - t0
    engine.slots = [None] * engine.B  # (the slots' caches are scratch: nothing was committed)
    return times[max(times)] / times[1]


# host-side calls that wait for the device (each one drains the queue of launched kernels)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")
# kernel launches: through the runtime API and through the driver API (CUDA 13's libraries use both)
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")  # a graph replay: one launch


def profile(engine, adapter, reqs: list[Request], sync, tokens: int, time_forwards: bool) -> dict:
    """One more pass under torch.profiler: per generated token, kernel launches and host waits on
    the device, and the operators with the most host time (a launch-bound decode is paid on the host)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        run(engine, adapter, reqs, sync, time_forwards)
    events = prof.key_averages()
    count = {e.key: e.count for e in events}
    top = sorted((e for e in events if not e.key.startswith("cuda")), key=lambda e: -e.self_cpu_time_total)[:12]
    return {"kernel_launches_per_token": round(sum(c for k, c in count.items() if k.startswith(LAUNCH_CALLS)) / tokens, 1),
            "host_waits_per_token": {k: round(count[k] / tokens, 2) for k in SYNC_CALLS if k in count},
            "ops_per_token": round(sum(e.count for e in events if e.key.startswith("aten::")) / tokens, 1),
            "top_self_cpu_ms_per_token": {e.key: round(e.self_cpu_time_total / 1e3 / tokens, 3) for e in top}}


TABLE_HEAD = (f"{'batch':>5} {'side':18} {'ms/token':>9} {'x limit':>8} {'vs HF':>6} {'median':>7} {'vs HF':>6} "
              f"{'overhead':>9} {'mismatch':>9} {'seq differ':>10} {'warm-up s':>9}")


def print_header(res: dict) -> None:
    print(f"\n{res['size']} target, {res['params'] / 1e6:,.1f} M parameters, {res['dtype']} on {res['device_name']}, "
          f"{res['max_new']} new tokens, min of {res['reps']} interleaved repetitions; decode weights "
          f"{res['decode_weight_bytes'] / 2**30:.2f} GiB, copy bandwidth {res['copy_bandwidth_gbs']:.0f} GB/s: "
          f"{1e3 * res['step_limit_s']:.3f} ms per step at the bandwidth limit")
    print(TABLE_HEAD + "\n" + "-" * len(TABLE_HEAD), flush=True)


def print_batch(b: str, fig: dict) -> None:
    for name in SIDES:
        f = fig[name]
        over = "-" if f["overhead_share"] is None else f"{f['overhead_share']:.1%}"
        print(f"{b:>5} {name:18} {f['ms_per_token']:9.3f} {f['x_bandwidth_limit']:8.2f} {f.get('time_vs_hf', 1.0):6.2f} "
              f"{f['median_ms_per_token']:7.3f} {f.get('median_time_vs_hf', 1.0):6.2f} {over:>9} "
              f"{f.get('mismatch_vs_hf', 0.0):9.2%} {f.get('sequences_differ_vs_hf', 0.0):10.0%} {fig['warmup_s'][name]:9.1f}")
    s = fig["speculative"]
    print(f"{'':>5} speculation: {s['tokens_per_step']:.2f} tokens/step, goodput {s['goodput_nodes_per_step']:.1f} "
          f"nodes/step, vs compiled engine AR time {s['time_vs_engine_ar']:.2f}, mismatch vs AR "
          f"{s['mismatch_vs_engine_ar']:.2%}; compiled verify of a 40-node tree {fig['verify40_over_ar_step']:.2f}x "
          f"an AR step", flush=True)
    for name, prof in fig.get("profile", {}).items():
        print(f"{'':>5} profile {name}: per token {prof['kernel_launches_per_token']} kernel launches, "
              f"{prof['ops_per_token']} aten ops, host waits {prof['host_waits_per_token']}; host ms per token, top ops:")
        print("".join(f"{'':>7}{k:52} {v:8.3f}\n" for k, v in prof["top_self_cpu_ms_per_token"].items()), end="", flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=sorted(SIZES), default="gpu")
    ap.add_argument("--batch", action="append", type=int, default=[])
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                    help="auto: bfloat16 on CUDA, float32 elsewhere")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    ap.add_argument("--profile", action="store_true",
                    help="per batch, one more pass of each side under torch.profiler: kernel launches, "
                         "host waits on the device and the top host-time operators per token")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_gpu: skipped: no CUDA")
        res = {"skipped": "no CUDA"}
    else:
        res = measure(args)
    write(args.out, res)
    return res


def write(out: str | None, res: dict) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=2))


def measure(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else (torch.bfloat16 if cuda else torch.float32)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    model = build_target(args.size, args.device, dtype)
    adapter = adapter_for(model)
    torch.manual_seed(1)
    with torch.device(args.device):
        drafter = FoveaDrafter.from_target(adapter, **SIZES[args.size]["drafter"]).eval()
    build_s = time.perf_counter() - t0
    weights, bandwidth = decode_weight_bytes(model), copy_bandwidth(args.device, (1 << 30) if cuda else (1 << 26))
    res = {"size": args.size, "device": args.device, "dtype": str(dtype).removeprefix("torch."),
           "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "params": sum(p.numel() for p in model.parameters()),
           "drafter_params": sum(p.numel() for p in drafter.parameters()),
           "decode_weight_bytes": weights, "copy_bandwidth_gbs": round(bandwidth / 1e9, 1),
           "step_limit_s": weights / bandwidth,
           "max_new": args.max_new, "reps": args.reps, "build_s": round(build_s, 2), "batches": {}}
    print_header(res)
    for b in args.batch or [1, 8, 32]:  # each batch printed and written as it ends (a killed run keeps them)
        res["batches"][str(b)] = fig = bench_batch(adapter, drafter, args.size, b, args, sync, res["step_limit_s"])
        print_batch(str(b), fig)
        write(args.out, res)
    if cuda:
        res["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    res["total_s"] = round(time.perf_counter() - t0, 1)
    return res


if __name__ == "__main__":
    main()
