#!/usr/bin/env bash
# GPU readiness in one run (< 10 min on one H100/H200): the `gpu`-marked tests, then the benchmark.
#   bash scripts/gpu_check.sh                 # figures -> ${OUT:-/tmp}/gpu_bench.json, gpu_bench_7b.json
#   OUT=runs/gpu_check bash scripts/gpu_check.sh
#   PYTHON=python3 bash scripts/gpu_check.sh  # an existing environment (a GPU image's torch), no install
# Tests (tests/gpu): decoding on CUDA in fp32 (engine AR and speculation, eager and compiled - CUDA
# graphs -, token-identical to HF generate) and bf16 (mismatch rate printed, every divergence checked
# to be a logit tie); the precompute prefill and 16-bit artifacts on CUDA; DeepSpeed ZeRO-2 updates
# over nccl on one GPU.
# Benchmark (scripts/bench_gpu.py): a ~1.1 B-parameter random LLaVA (TinyLlama-shaped decoder) at
# batch 1, 8, 32 and a 7B-shaped random LLaVA-NeXT at batch 1, 8; bf16, greedy, 64 new tokens: ms per
# token of HF generate (eager, and its static cache + compiled decode), engine AR (eager and compiled)
# and compiled goodput speculation with a random drafter, each as a multiple of the bandwidth limit;
# the compiled verify of a 40-node tree over an AR step; kernel launches per token (--profile);
# compile seconds. Without CUDA every part skips, exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
[ -n "${PYTHON:-}" ] || [ -x .venv/bin/python ] || bash scripts/install.sh
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled SPEC_NO_PROGRESS=1
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/spec_core/torch_extensions}"
out="${OUT:-/tmp}"
mkdir -p "$out"
t0=$(date +%s)
cuda=$("$py" -c "import torch; print(int(torch.cuda.is_available()))")
# -s: the tests print their bf16 mismatch rates and loss curves
# --timeout: a hung collective (nccl) fails its test instead of eating the device time
# a failing test still lets the benchmark run; the script's status is the tests'
tests_rc=0
"$py" -m pytest -m gpu tests/gpu -q -s -p no:cacheprovider --timeout=300 || tests_rc=$?
t1=$(date +%s)
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/spec_core/torchinductor}"
"$py" scripts/bench_gpu.py --out "$out/gpu_bench.json" --max-new 64 --reps 3 --profile \
  --batch 1 --batch 8 --batch 32
if [ "$cuda" = 1 ]; then
  "$py" scripts/bench_gpu.py --size 7b --out "$out/gpu_bench_7b.json" --max-new 64 --reps 2 --batch 1 --batch 8
fi
t2=$(date +%s)
if [ "$cuda" = 1 ]; then
  echo "gpu_check: tests $((t1 - t0))s, benchmark $((t2 - t1))s; figures in $out/gpu_bench.json, $out/gpu_bench_7b.json"
else
  echo "gpu_check: no CUDA on this machine: every GPU test and the benchmark skipped ($((t2 - t0))s)"
fi
exit "$tests_rc"
