#!/usr/bin/env bash
# The inputs of `scripts/bench_batch.py --grid` on the `small` world, from a fresh clone: the world
# (built once and cached, shared with the demo), the demo chain up to its precompute (6,000
# samples), then two drafters trained alike (2 epochs, the demo's setting): FOVEA and the
# EAGLE-2-style control (drafter.visual_correction=false). Prints the grid's command at the end.
#   bash scripts/bench_batch_inputs.sh       # ~45-90 min on 2 cores when the world is not built yet
# Outputs: runs/reference/small, runs/demo/{precompute,train_drafter}/reference-small{,-nc}.
# Every step is a cache hit or resumes when run again (jobs: run.on_mismatch=restart, like the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=.venv/bin/python
REF="${REF:-runs/reference/small}"
OUT="${OUT:-runs/demo}"
RID=reference-small
RUN=(--set "run.output_uri=$OUT" --set run.on_mismatch=restart)

bash scripts/install.sh
$PY scripts/build_reference.py --size small --out "$REF"
$PY jobs/synth_data.py --config manifests/jobs/synth_data.yaml "${RUN[@]}" --set "run.run_id=$RID" --set data.world=small
$PY jobs/build_manifests.py --config manifests/jobs/build_manifests.yaml "${RUN[@]}" --set "run.run_id=$RID" \
    --set "data.vars.REF=$REF"
$PY jobs/precompute.py --config manifests/jobs/precompute.yaml "${RUN[@]}" --set "run.run_id=$RID" \
    --set "data.manifest=$OUT/build_manifests/$RID/train.parquet" --set "target.path=$REF/target" \
    --set data.limit=6000 --set data.limit_unit=rows
for run_id in "$RID" "$RID-nc"; do
  control=(); [ "$run_id" = "$RID-nc" ] && control=(--set drafter.visual_correction=false)
  $PY jobs/train_drafter.py --config manifests/jobs/train_drafter.yaml "${RUN[@]}" --set "run.run_id=$run_id" \
      "${control[@]}" --set "data.artifacts=$OUT/precompute/$RID/artifacts" --set "target.path=$REF/target" \
      --set train.epochs=2
done
echo "inputs ready; the grid:"
echo "  $PY scripts/bench_batch.py --target $REF/target --batch 1 --batch 8 --reps 8 --grid \\"
echo "      --method eagle2=$OUT/train_drafter/$RID-nc/drafter --method fovea=$OUT/train_drafter/$RID/drafter --method recycling"
