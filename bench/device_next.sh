#!/usr/bin/env bash
# Issue 11's device work, as much as one call holds, on whichever card the device tool lends:
#   AUTOPROFILER_GIT_SHA=<sha, computed here> AUTOPROFILER_GIT_DIRTY=0 OUT=$OUT SECONDS_LEFT=540 bash bench/device_next.sh
# The steps and their order come from bench/device_plan.py (on the H200: the generated recording until 300
# tasks are complete, then the playbook's reachable cells, then the range-replay profiles of the many-kernel
# suite tasks; on an H100: its playbook cells, then its recording). Each step gets the time left; one
# that ends early leaves the rest to the next, and none starts with less than MIN_STEP_SECONDS (150).
# Step N writes under $OUT/N_<step>/ (step.log, the step's own logs, rec.tgz). Each rec.tgz holds its
# recording whole as the device had it after that step, so here unpack them in the order they ran, and
# commit before the next call (the device works on a copy of this tree):
#   bash bench/device_unpack.sh <files_at> <tag> && git add -A datasets && git commit -m ...
# REQUIRE_GPU=H200: exit at once, nothing run, unless the GPU's name contains it.
# DRY_RUN=1: print each step's command instead of running it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s); BUDGET=${SECONDS_LEFT:-540}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU" > "$OUT/gpu.txt"
if [ -n "${REQUIRE_GPU:-}" ] && [[ "$GPU" != *"$REQUIRE_GPU"* ]]; then
  echo "GPU $GPU is not the required $REQUIRE_GPU: nothing run"; exit 0
fi
python3 bench/device_plan.py "$GPU" > "$OUT/plan.txt" || exit 2
echo "GPU $GPU; plan:"; cat "$OUT/plan.txt"
run() { if [ "${DRY_RUN:-0}" = 1 ]; then echo "$*"; else "$@" < /dev/null; fi; }
n=0
while IFS=$'\t' read -r -u 3 step why; do
  n=$((n + 1)); dir=$OUT/${n}_$step; mkdir -p "$dir"
  t=$(left)
  if [ "$t" -lt "${MIN_STEP_SECONDS:-150}" ]; then echo "step $n $step: ${t}s left, not started"; continue; fi
  # a later step records into what an earlier one of this call marked with the same sha
  same=${SAME_SHA_OK:-0}; [ $n -gt 1 ] && same=1
  echo "step $n $step, ${t}s left: $why"
  case $step in
    record) run env SAME_SHA_OK=$same OUT="$dir" SECONDS_LEFT=$t FILTER_SECONDS=${FILTER_SECONDS:-0} \
        bash bench/h200_record_generated.sh > "$dir/step.log" 2>&1 ;;
    playbook) run env SAME_SHA_OK=$same TARGET=generated OUT="$dir" RECORD_SECONDS=$((t - 60)) \
        bash bench/h200_record_playbook.sh all > "$dir/step.log" 2>&1 ;;
    suite_range) run env OUT="$dir" RECORD_SECONDS=$((t - 60)) RECORD_TIMEOUT=$((t - 20)) \
        bash bench/h200_session_d.sh record > "$dir/step.log" 2>&1 ;;
    *) echo "unknown step $step" > "$dir/step.log" ;;
  esac
  echo "step $n $step rc=$?"; tail -8 "$dir/step.log"
done 3< "$OUT/plan.txt"
