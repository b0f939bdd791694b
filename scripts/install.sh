#!/usr/bin/env bash
# Create .venv at the repository root (if missing) and install the project with its test extra.
# torch==2.13.0 goes in the SAME pip call as deepspeed and the rest: on CPU machines it takes the
# local CPU wheel; alone, deepspeed's `torch>=2.0` would pull a multi-GB CUDA build.
# scripts/constraints.txt holds the versions tested together (no resolver backtracking).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml scripts/install.sh scripts/constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  start=$(date +%s)
  # (grep drops pip's warnings about local index folders this machine may not have)
  .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel 2> >(grep -v "is ignored: it is neither" >&2)
  .venv/bin/python -m pip install --quiet -c scripts/constraints.txt "$TORCH_PIN" -e ".[test]" 2> >(grep -v "is ignored: it is neither" >&2)
  .venv/bin/python -c "import torch, ray, deepspeed, transformers, spec_core" >/dev/null
  rm -f .venv/.installed-*
  touch "$stamp"
  echo "install: $(( $(date +%s) - start ))s"
fi
