#!/usr/bin/env bash
# The README's test command: create .venv if missing, install the project + test extra, run ruff
# (the lint config is in pyproject.toml) and pytest.
#   bash scripts/test.sh                 # everything CI runs
#   bash scripts/test.sh -m "not slow"   # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/install.sh
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled SPEC_NO_PROGRESS=1
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The venv first on PATH (as activating it would) for every process the tests start: its ninja
# then builds DeepSpeed's JIT ops everywhere. The system's ninja (another version, another build log
# format) discards the other's log and rebuilds: measured, one or two ~40-60 s rebuilds inside the
# suite wherever some processes had the venv on PATH (`ray start`'s workers) and others not.
export PATH="$PWD/.venv/bin:$PATH"
# Persistent DeepSpeed JIT-op cache (its first build costs minutes).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/spec_core/torch_extensions}"
# Every deepspeed.initialize on CPU loads the shared-memory comm op: build it here (~30-60 s cold,
# ~1 s when up to date; a new checkout's venv path is a rebuild) rather than inside a test's workers.
.venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 || true
.venv/bin/ruff check .
t1=$(date +%s)
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
t2=$(date +%s)
echo "test.sh: install/check $((t1 - t0))s, pytest $((t2 - t1))s, exit $rc"
exit $rc
