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
# Persistent DeepSpeed JIT-op cache (its first build costs minutes).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/spec_core/torch_extensions}"
# Every deepspeed.initialize on CPU loads the shared-memory comm op: build it into the cache once
# here (~30-60 s cold, skipped when cached) rather than inside the first training test's workers.
if ! ls "$TORCH_EXTENSIONS_DIR"/deepspeed_shm_comm/*.so >/dev/null 2>&1; then
  .venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 || true
fi
.venv/bin/ruff check .
t1=$(date +%s)
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
t2=$(date +%s)
echo "test.sh: install/check $((t1 - t0))s, pytest $((t2 - t1))s, exit $rc"
exit $rc
