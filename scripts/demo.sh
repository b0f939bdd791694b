#!/usr/bin/env bash
# The main job chains on the embedded default (local directories, a local Ray, the reference world).
#   bash scripts/demo.sh            # full run
#   QUICK=1 bash scripts/demo.sh    # a few minutes: the tiny world, fewer samples
# Outputs go under $OUT (default runs/demo), the reference world under runs/reference/<size>;
# the last lines are a summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="${QUICK:-0}"
OUT="${OUT:-runs/demo}"
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=.venv/bin/python

step() { printf '\n=== %s ===\n' "$*"; }

step "install (once)"
bash scripts/install.sh

if [ "$QUICK" = 1 ]; then
  WORLD=tiny
  DATA_SET=(--set 'data.per_task={train: 10, eval: 5}')
  PRECOMPUTE_LIMIT=null
  EPOCHS=2
  GEN_LIMIT=2             # evaluation samples per task
  IMG_LIMIT=2             # image prompts and video prompts
else
  WORLD=small
  DATA_SET=()
  PRECOMPUTE_LIMIT=1200   # of the 12,000 training samples: a few CPU minutes
  EPOCHS=3
  GEN_LIMIT=10
  IMG_LIMIT=8
fi
REFERENCE="${REFERENCE:-runs/reference/$WORLD}"

step "reference world '$WORLD' -> $REFERENCE (built once, then a cache hit)"
$PY scripts/build_reference.py --size "$WORLD" --out "$REFERENCE"

step "synth_data: the reference world's six-task dataset, rendered with Ray Data"
$PY jobs/synth_data.py --config manifests/jobs/synth_data.yaml --set "run.output_uri=$OUT" "${DATA_SET[@]}"

step "build_manifests: the drafter's training pool and evaluation manifests from the reference world"
$PY jobs/build_manifests.py --config manifests/jobs/build_manifests.yaml \
    --set "run.output_uri=$OUT" --set run.run_id=reference --set "data.vars.REF=$REFERENCE"

step "precompute: drafter-training artifacts from the frozen target (Ray Data, actor pool)"
$PY jobs/precompute.py --config manifests/jobs/precompute.yaml --set "run.output_uri=$OUT" \
    --set run.run_id=reference --set "data.manifest=$OUT/build_manifests/reference/train.parquet" \
    --set "target.path=$REFERENCE/target" --set "data.limit=$PRECOMPUTE_LIMIT"

step "train_drafter: the FOVEA drafter on those artifacts (Ray Train + DeepSpeed ZeRO-2)"
$PY jobs/train_drafter.py --config manifests/jobs/train_drafter.yaml --set "run.output_uri=$OUT" \
    --set run.run_id=reference --set "data.artifacts=$OUT/precompute/reference/artifacts" \
    --set "target.path=$REFERENCE/target" --set "train.epochs=$EPOCHS"

step "generate: answers and captions, FOVEA speculative decoding against AR (Ray actor pool)"
DRAFTER="$OUT/train_drafter/reference/drafter"
$PY jobs/generate.py --config manifests/jobs/generate.yaml --set "run.output_uri=$OUT" \
    --set run.run_id=reference --set "data.manifest=$OUT/build_manifests/reference/eval" \
    --set "data.limit_per_source=$GEN_LIMIT" --set "target.path=$REFERENCE/target" \
    --set "methods.fovea.drafter=$DRAFTER" --set "methods.fovea_cpu.drafter=$DRAFTER" \
    --set 'compare=[ar, fovea, fovea_cpu]' --set 'compute.batch_sizes=[1, 4]'
echo "report: $OUT/generate/reference/report.md"

step "generate_images: images and videos, SJD / SCD against AR (Ray actor pool)"
$PY jobs/generate_images.py --config manifests/jobs/generate_images.yaml --set "run.output_uri=$OUT" \
    --set run.run_id=reference --set "generator.path=$REFERENCE/generator" \
    --set "data.limit_per_kind=$IMG_LIMIT" --set compute.num_actors=2
echo "report: $OUT/generate_images/reference/report.md"

step "summary"
$PY scripts/demo_summary.py "$OUT" "$REFERENCE"
