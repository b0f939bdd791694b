#!/usr/bin/env bash
# The main job chain on the embedded default (local directories, a local Ray, the reference world).
#   bash scripts/demo.sh            # full run on the `small` world: FOVEA against AR, measured
#   QUICK=1 bash scripts/demo.sh    # a few minutes on the `tiny` world: every job runs, outputs are
#                                   # checked lossless; its speed figures mean nothing (untrained world)
#   WORLD=hires bash scripts/demo.sh   # the chain on the hires world: a LLaVA-NeXT (AnyRes) target,
#                                   # 172 visual tokens per 192 px image, region questions (no image
#                                   # generator there: generate_images runs on the small world only)
#   QUICK=1 WORLD=hires ...         # the same on the untrained `tiny-hires` world, in minutes
# Outputs go under $OUT (default runs/demo) with run id reference-<world>, the reference world under
# runs/reference/<world>. QUICK and full runs never share a run directory, and a rerun with other
# settings replaces the old run (run.on_mismatch=restart) instead of mixing into it.
# The last lines are a summary: what ran, what it shows, where the reports are.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK="${QUICK:-0}"
KIND="${WORLD:-small}"   # which reference world: small | hires
OUT="${OUT:-runs/demo}"
case "$KIND" in
  small|hires) ;;
  *) echo "demo: WORLD must be small or hires, got '$KIND'" >&2; exit 2 ;;
esac
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=.venv/bin/python
T0=$(date +%s)

step() { printf '\n=== %s === (%s elapsed)\n' "$1" "$(elapsed)"; }
elapsed() { local s=$(( $(date +%s) - T0 )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

if [ "$QUICK" = 1 ]; then
  WORLD=tiny
  [ "$KIND" = hires ] && WORLD=tiny-hires
  DATA_SET=(--set 'data.per_task={train: 10, eval: 5}')
  PRECOMPUTE_LIMIT=null
  EPOCHS=2
  GEN_LIMIT=2             # evaluation samples per task
  IMG_LIMIT=2             # image prompts and video prompts
  BUILD_MIN=1; JOBS_MIN=10 # measured on 2 cores, 2026-12-07 (generate: its engines compile at actor start)
  ETA=(1 1 1 2 5 3)       # minutes per job: synth_data build_manifests precompute train generate images
else
  WORLD=small
  DATA_SET=()
  # Measured (an earlier demo): 1,200 samples x 3 epochs gave top-1 0.84 / 0.82 / 0.79 per draft step and
  # 1.28-1.34x; 6,000 x 2 epochs (750 updates, 16 min) gives 0.94 / 0.93 / 0.86 - the quality of
  # the benchmark's 11,994 x 1 epoch drafters (docs/results.md) - and 1.5x, every task faster than AR with the CPU tree.
  PRECOMPUTE_LIMIT=6000   # of the 11,994 training samples: a stratified sample of all six tasks
  EPOCHS=2
  GEN_LIMIT=10            # evaluation samples per task
  IMG_LIMIT=8
  BUILD_MIN=75; JOBS_MIN=30  # measured from a fresh clone: build 73 min (target 53, generator 18), jobs 28.6 min
  ETA=(1 1 4 16 4 5)
  if [ "$KIND" = hires ]; then
    # hires: a training step of its target costs ~3x the small world's (172 visual tokens; measured
    # on 2 cores, 0.78 vs 0.26 s per batch of 16), the drafter's ~2-3x; no generator to build;
    # 5,400 decoder steps: 90-133 min by machine (docs/results.md, 2026-12-06)
    WORLD=hires
    BUILD_MIN=120; JOBS_MIN=60
    ETA=(1 1 10 35 10 0)
  fi
fi
LIMIT_UNIT=rows; [ "$KIND" = hires ] && LIMIT_UNIT=images  # six questions per image: keep them together
REFERENCE="${REFERENCE:-runs/reference/$WORLD}"
RID="reference-$WORLD"
RUN=(--set "run.output_uri=$OUT" --set "run.run_id=$RID" --set run.on_mismatch=restart)

step "install (once)"
bash scripts/install.sh

if $PY scripts/build_reference.py --size "$WORLD" --out "$REFERENCE" --check >/dev/null 2>&1; then
  echo "expected: about $JOBS_MIN minutes on 2 cores (the reference world '$WORLD' is already built)"
else
  echo "expected: about $((BUILD_MIN + JOBS_MIN)) minutes on 2 cores: the reference world '$WORLD' is built once"
  echo "(about $BUILD_MIN min, then cached), then the jobs take about $JOBS_MIN min"
  echo "(interrupted? run it again: the build resumes at its first unfinished stage, the jobs at their last commit)"
fi

step "reference world '$WORLD' -> $REFERENCE (built once, then a cache hit)"
$PY scripts/build_reference.py --size "$WORLD" --out "$REFERENCE"

step "synth_data: the reference world's six-task dataset, rendered with Ray Data (about ${ETA[0]} min)"
$PY jobs/synth_data.py --config manifests/jobs/synth_data.yaml "${RUN[@]}" "${DATA_SET[@]}" --set "data.world=$KIND"

step "build_manifests: the drafter's training pool and evaluation manifests (about ${ETA[1]} min)"
$PY jobs/build_manifests.py --config manifests/jobs/build_manifests.yaml "${RUN[@]}" --set "data.vars.REF=$REFERENCE"
MANIFESTS="$OUT/build_manifests/$RID"

step "precompute: drafter-training artifacts from the frozen target, Ray Data actor pool (about ${ETA[2]} min)"
$PY jobs/precompute.py --config manifests/jobs/precompute.yaml "${RUN[@]}" \
    --set "data.manifest=$MANIFESTS/train.parquet" --set "target.path=$REFERENCE/target" \
    --set "data.limit=$PRECOMPUTE_LIMIT" --set "data.limit_unit=$LIMIT_UNIT"

step "train_drafter: the FOVEA drafter, Ray Train + DeepSpeed ZeRO-2 (about ${ETA[3]} min)"
$PY jobs/train_drafter.py --config manifests/jobs/train_drafter.yaml "${RUN[@]}" \
    --set "data.artifacts=$OUT/precompute/$RID/artifacts" --set "target.path=$REFERENCE/target" \
    --set "train.epochs=$EPOCHS"

step "generate: answers and captions, FOVEA speculative decoding against AR and HF generate, Ray actor pool (about ${ETA[4]} min)"
DRAFTER="$OUT/train_drafter/$RID/drafter"
$PY jobs/generate.py --config manifests/jobs/generate.yaml "${RUN[@]}" \
    --set "data.manifest=$MANIFESTS/eval" --set "data.limit_per_source=$GEN_LIMIT" \
    --set "target.path=$REFERENCE/target" --set "methods.fovea.drafter=$DRAFTER" \
    --set "methods.fovea_cpu.drafter=$DRAFTER" --set "methods.fovea_goodput.drafter=$DRAFTER" \
    --set 'compare=[ar, hf, fovea, fovea_cpu, fovea_goodput]' --set 'compute.batch_sizes=[1, 4]'

if [ "$KIND" = hires ]; then
  echo "(generate_images: the hires world has no image / video generator; SJD / SCD run on the small world)"
else
  step "generate_images: images and videos, SJD / SCD against AR, Ray actor pool (about ${ETA[5]} min)"
  $PY jobs/generate_images.py --config manifests/jobs/generate_images.yaml "${RUN[@]}" \
      --set "generator.path=$REFERENCE/generator" --set "data.limit_per_kind=$IMG_LIMIT" --set compute.num_actors=2
fi

step "summary"
SUMMARY=(--out "$OUT" --run-id "$RID" --world "$REFERENCE")
[ "$QUICK" = 1 ] && SUMMARY+=(--quick)
$PY scripts/demo_summary.py "${SUMMARY[@]}"
echo "demo: done in $(elapsed)"
