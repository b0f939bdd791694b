"""Decoding speed on a GPU-sized target with random weights: HF `generate`, the engine's AR and
goodput speculation with a random-init drafter, per batch size. Built in code (no downloads).

    python scripts/bench_gpu.py --out /tmp/gpu_bench.json                  # CUDA, bf16, batch 1 / 8 / 32
    python scripts/bench_gpu.py --device cpu --size tiny --batch 1 --batch 2 --max-new 8 --reps 1

Target: a `LlavaForConditionalGeneration` of the reference architecture (CLIP tower, MLP
projector, Llama decoder) with TinyLlama's decoder shape (hidden 2048, 22 layers, 32 heads, 4 KV
heads, ~1.1 B parameters) and LLaVA-1.5's vocabulary (32064; image token 32000), a small CLIP
tower (224 px, patch 14: 256 image tokens); `--size tiny` is a few-MB model for CPU runs.
Drafter: an untrained FOVEA drafter (one block) on it, so speculation accepts little: the
goodput policy should fall back towards AR, and the figure bounds what speculation costs when
drafts miss.

Greedy, a fixed number of new tokens (EOS off on every side), one request per slot (`batch`
requests, prompts of different lengths: HF left-pads). Sides are interleaved per repetition
after one warm-up repetition (which also calibrates the goodput policy), the minimum and the
median of each are reported (a VM's host is noisy; a launch-bound decode is paid on the host).
Per batch, printed and written as it ends: ms per generated token; the overhead share, step time
outside the target's language-model forwards (hooks synchronized on CUDA, so it includes GPU
time); the token-mismatch rate of the engine's AR and of speculation against HF (position-wise;
in bf16 greedy outputs may differ where logits tie within rounding, in fp32 they must not) and the
fraction of sequences that differ; speculation's tokens per step and the goodput policy's mean
nodes per step.
--profile adds, per batch, one more pass of HF and engine AR under torch.profiler: kernel
launches, aten ops and host waits on the device per token, and the operators with the most host
time. Writes every figure to --out as JSON; prints a table. With --device cuda and no CUDA: prints
'skipped: no CUDA' and exits 0 (the JSON then says so).
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
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration  # noqa: E402

from bench_batch import ForwardTimer  # noqa: E402
from spec_core.decoding import DecodeEngine, Request, TreeConfig  # noqa: E402
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
}
PAD, BOS = 0, 1


def build_target(size: str, device: str, dtype: torch.dtype) -> LlavaForConditionalGeneration:
    """The random-weight target (seeded), initialised directly on `device` in `dtype`."""
    s = SIZES[size]
    config = LlavaConfig(vision_config=CLIPVisionConfig(**s["vision"]),
                         text_config=LlamaConfig(**s["text"], pad_token_id=PAD, bos_token_id=BOS, eos_token_id=2),
                         image_token_index=s["image_token"], vision_feature_layer=-1,
                         vision_feature_select_strategy="default", projector_hidden_act="gelu")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlavaForConditionalGeneration._from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None  # fixed length: every side decodes max_new tokens
    model.generation_config.pad_token_id = PAD
    return model.eval().requires_grad_(False)


def make_requests(size: str, n: int, max_new: int, seed: int = 0) -> list[Request]:
    """n one-image prompts: BOS, random words, the expanded image placeholder, random words."""
    s, g = SIZES[size], torch.Generator().manual_seed(seed)
    v = s["vision"]
    n_image = (v["image_size"] // v["patch_size"]) ** 2  # "default" strategy drops CLS
    vocab = s["image_token"]  # words below the image token
    out = []
    for i in range(n):
        lo, hi = s["before"]
        before = int(torch.randint(lo, hi + 1, (1,), generator=g))
        lo, hi = s["after"]
        after = int(torch.randint(lo, hi + 1, (1,), generator=g))
        words = lambda k: torch.randint(3, vocab, (k,), generator=g).tolist()  # noqa: E731
        ids = [BOS] + words(before) + [s["image_token"]] * n_image + words(after)
        pixels = torch.randn(1, 3, v["image_size"], v["image_size"], generator=g)
        out.append(Request({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                            "pixel_values": pixels}, max_new, key=i))
    return out


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


def run(engine, adapter, reqs: list[Request], sync) -> dict:
    """One pass over the requests: outputs in request order, wall and forward seconds, steps."""
    timer = SyncedForwardTimer(adapter.model.model.language_model, sync)
    sync()
    t0 = time.perf_counter()
    results = sorted(engine.generate(reqs), key=lambda r: r.key)
    sync()
    dt = time.perf_counter() - t0
    timer.close()
    return {"out": [r.sequences[0].tolist() for r in results], "seconds": dt, "forward": timer.seconds,
            "steps": sum(r.steps for r in results), "tokens": sum(r.sequences.shape[1] for r in results)}


def bench_batch(adapter, drafter, size: str, b: int, args, sync) -> dict:
    """Every side at batch b, interleaved; figures of the fastest repetition of each."""
    reqs = make_requests(size, b, args.max_new, seed=b)
    tree = TreeConfig(policy="goodput")
    cap = max(r.inputs["input_ids"].shape[1] for r in reqs) + args.max_new + step_scratch(tree, True) + 1
    engines = {"hf": HFEngine(adapter, batch_size=b),
               "engine_ar": DecodeEngine(adapter, None, batch_size=b, capacity=cap),
               "speculative": DecodeEngine(adapter, drafter, batch_size=b, capacity=cap, tree=tree)}
    runs: dict[str, list[dict]] = {k: [] for k in engines}
    for rep in range(args.reps + 1):  # repetition 0: warm-up and the goodput policy's calibration
        for name, engine in engines.items():
            r = run(engine, adapter, reqs, sync)
            if rep:
                runs[name].append(r)
    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    tokens = b * args.max_new
    ref = best["hf"]["out"]
    fig = {"requests": b, "prompt_tokens": [int(r.inputs["input_ids"].shape[1]) for r in reqs]}
    for name, r in best.items():
        fig[name] = {"ms_per_token": round(1e3 * r["seconds"] / tokens, 4),
                     "median_ms_per_token": round(1e3 * statistics.median(x["seconds"] for x in runs[name]) / tokens, 4),
                     "overhead_share": round(1 - r["forward"] / r["seconds"], 4),
                     "seconds": [round(x["seconds"], 4) for x in runs[name]]}
        if name != "hf":
            fig[name]["mismatch_vs_hf"] = round(mismatch_rate(ref, r["out"]), 4)
            fig[name]["sequences_differ_vs_hf"] = round(sum(a != o for a, o in zip(ref, r["out"])) / b, 4)
            fig[name]["time_vs_hf"] = round(r["seconds"] / best["hf"]["seconds"], 4)
            fig[name]["median_time_vs_hf"] = round(fig[name]["median_ms_per_token"] / fig["hf"]["median_ms_per_token"], 4)
    spec = best["speculative"]
    fig["speculative"]["tokens_per_step"] = round((spec["tokens"] - b) / max(spec["steps"], 1), 3)  # first: prefill
    fig["speculative"]["mismatch_vs_engine_ar"] = round(mismatch_rate(best["engine_ar"]["out"], spec["out"]), 4)
    fig["speculative"]["time_vs_engine_ar"] = round(spec["seconds"] / best["engine_ar"]["seconds"], 4)
    chosen = engines["speculative"].policy.chosen
    fig["speculative"]["goodput_nodes_per_step"] = round(sum(chosen) / max(len(chosen), 1), 2)
    if args.profile:
        fig["profile"] = {name: profile(engines[name], adapter, reqs, sync, tokens) for name in ("hf", "engine_ar")}
    return fig


# host-side calls that wait for the device (each one drains the queue of launched kernels)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")
# kernel launches: through the runtime API and through the driver API (CUDA 13's libraries use both)
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel")


def profile(engine, adapter, reqs: list[Request], sync, tokens: int) -> dict:
    """One more pass under torch.profiler: per generated token, kernel launches and host waits on
    the device, and the operators with the most host time (a launch-bound decode is paid on the host)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        run(engine, adapter, reqs, sync)
    events = prof.key_averages()
    count = {e.key: e.count for e in events}
    top = sorted((e for e in events if not e.key.startswith("cuda")), key=lambda e: -e.self_cpu_time_total)[:12]
    return {"kernel_launches_per_token": round(sum(c for k, c in count.items() if k.startswith(LAUNCH_CALLS)) / tokens, 1),
            "host_waits_per_token": {k: round(count[k] / tokens, 2) for k in SYNC_CALLS if k in count},
            "ops_per_token": round(sum(e.count for e in events if e.key.startswith("aten::")) / tokens, 1),
            "top_self_cpu_ms_per_token": {e.key: round(e.self_cpu_time_total / 1e3 / tokens, 3) for e in top}}


TABLE_HEAD = (f"{'batch':>5} {'side':12} {'ms/token':>9} {'vs HF':>6} {'median':>7} {'vs HF':>6} {'overhead':>9} "
              f"{'mismatch':>9} {'seq differ':>10}")


def print_header(res: dict) -> None:
    print(f"\n{res['size']} target, {res['params'] / 1e6:,.1f} M parameters, {res['dtype']} on {res['device_name']}, "
          f"{res['max_new']} new tokens, min of {res['reps']} interleaved repetitions")
    print(TABLE_HEAD + "\n" + "-" * len(TABLE_HEAD), flush=True)


def print_batch(b: str, fig: dict) -> None:
    for name in ("hf", "engine_ar", "speculative"):
        f = fig[name]
        print(f"{b:>5} {name:12} {f['ms_per_token']:9.3f} {f.get('time_vs_hf', 1.0):6.2f} "
              f"{f['median_ms_per_token']:7.3f} {f.get('median_time_vs_hf', 1.0):6.2f} "
              f"{f['overhead_share']:9.1%} {f.get('mismatch_vs_hf', 0.0):9.2%} {f.get('sequences_differ_vs_hf', 0.0):10.0%}")
    s = fig["speculative"]
    print(f"{'':>5} speculation: {s['tokens_per_step']:.2f} tokens/step, goodput {s['goodput_nodes_per_step']:.1f} "
          f"nodes/step, vs engine AR time {s['time_vs_engine_ar']:.2f}, mismatch vs AR {s['mismatch_vs_engine_ar']:.2%}",
          flush=True)
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
                    help="per batch, one more pass of HF and engine AR under torch.profiler: kernel launches, "
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
    res = {"size": args.size, "device": args.device, "dtype": str(dtype).removeprefix("torch."),
           "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "params": sum(p.numel() for p in model.parameters()),
           "drafter_params": sum(p.numel() for p in drafter.parameters()),
           "max_new": args.max_new, "reps": args.reps, "build_s": round(build_s, 2), "batches": {}}
    print_header(res)
    for b in args.batch or [1, 8, 32]:  # each batch printed and written as it ends (a killed run keeps them)
        res["batches"][str(b)] = fig = bench_batch(adapter, drafter, args.size, b, args, sync)
        print_batch(str(b), fig)
        write(args.out, res)
    if cuda:
        res["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    res["total_s"] = round(time.perf_counter() - t0, 1)
    return res


if __name__ == "__main__":
    main()
