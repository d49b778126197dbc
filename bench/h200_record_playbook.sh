#!/usr/bin/env bash
# H200 outcomes of the eight playbook actions (issue 12) as action rows keyed rule-v1/<action>, with the
# evaluation settings of the recorded rule actions (50 timing, 3 correctness trials, 5 warm-up), added to
# a recording: TARGET=suite (the default) the 45 suite tasks of datasets/h200_suite; TARGET=generated the
# generated tasks of datasets/recorded/h200 (datasets/recorded/h100 on an H100) that have every ncu group
# profiled (issue 11), only the cells playbook-v1 can reach (`--reachable`, from the card's committed
# report bench/results/rewriter_reachability_<card>.json: rerun bench/rewriter_reachability.py there when
# the recording grows; a task the report lacks gets no cell). From the repo
# root:
#   OUT=/tmp/out bash bench/h200_record_playbook.sh all       # the stages below in order, ~8 min in all
#   OUT=/tmp/out bash bench/h200_record_playbook.sh cheap     # sdpa, cudnn_benchmark, autocast_fp16/bf16
#   OUT=/tmp/out bash bench/h200_record_playbook.sh compile   # compile_cudagraphs, channels_last_compile
#   OUT=/tmp/out bash bench/h200_record_playbook.sh autotune  # compile_max_autotune, compile_coordinate_descent
#   OUT=/tmp/out bash bench/h200_record_playbook.sh loose     # tf32 + autocast at atol=rtol=1e-2 (own folder)
#   TARGET=generated OUT=/tmp/out bash bench/h200_record_playbook.sh all
# Every stage is resumable (rows are keyed; --max-seconds stops starting new work): run the same command
# again until each stage prints "complete: True" (the autotune stage will need more than one call: inductor
# autotunes GEMM templates for tens of seconds per task, and it runs 3 at a time so that its GPU
# benchmarking disturbs the other candidates' timing less). The cheap and compile stages run 6 at a time,
# as the rule actions were recorded. Then here: `bash bench/unpack_recording.sh <files_at>/rec.tgz` and run
#   python bench/rewriter_reachability.py datasets/h200_suite --out bench/results/rewriter_reachability
# (add the call to datasets/h200_suite/HISTORY.md). The loose stage's rows are not replayable (no profiles;
# the reward key has no tolerance, so they must not enter datasets/h200_suite): $OUT/r.tgz holds them.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/r
BUDGET=${RECORD_SECONDS:-420}   # seconds of new work per call (all stages together for "all")
START=$(date +%s)
COMMON="--timing-trials 50 --correctness-trials 3 --warmup 5 --device cuda --task-size full --source ncu"
# A task's rows come from one card: the suite's recording and datasets/recorded/h200 take rows from an
# H200 only; on an H100, TARGET=generated adds to datasets/recorded/h100.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU" in *H200*) CARD=h200 ;; *H100*) CARD=h100 ;; *) CARD=other ;; esac
case ${TARGET:-suite} in
suite)
  [ "$CARD" = h200 ] || { echo "TARGET=suite: datasets/h200_suite holds H200 rows; this GPU is '$GPU'" >&2; exit 2; }
  REC=datasets/h200_suite ;;
generated)
  [ "$CARD" != other ] || { echo "TARGET=generated: no recording for the GPU '$GPU'" >&2; exit 2; }
  REC=datasets/recorded/$CARD
  # the generated tasks with every group profiled (pyarrow: the device's python has no polars)
  IDS=$(python3 - "$REC" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "bench")
from device_plan import profiled_groups
groups = profiled_groups(Path(sys.argv[1]))
every = set().union(*groups.values()) if groups else set()
print(",".join(sorted(t for t, g in groups.items() if g == every)))
PY
)
  [ -n "$IDS" ] || { echo "no generated task has every group profiled yet" >&2; exit 2; }
  echo "generated tasks with every group: $(echo "$IDS" | tr ',' '\n' | wc -l)"
  COMMON="$COMMON --recording $REC --tasks datasets/ops_gen/tasks.parquet --filter $IDS"
  REACH=bench/results/rewriter_reachability_$CARD.json
  [ -f "$REACH" ] || { echo "TARGET=generated: no reachability report $REACH" >&2; exit 2; }
  COMMON="$COMMON --reachable $REACH" ;;
*) echo "TARGET: expected suite or generated, got ${TARGET}" >&2; exit 2 ;;
esac
source bench/lib_last_call.sh
check_last_call $REC || exit 2
mark_last_call $REC
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > $OUT/r/env_playbook.txt 2>&1

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
source bench/lib_pack.sh   # $OUT/rec.tgz packed every 30 s and at the end: a stopped call loses no part
start_packing "$OUT/rec.tgz" $REC

stage() {  # stage NAME ACTIONS JOBS EVAL_TIMEOUT [extra args]
  local name=$1 actions=$2 jobs=$3 eval_timeout=$4; shift 4
  local budget; budget=$(left)
  if [ "$budget" -lt 60 ]; then echo "stage $name: no time left in this call; run again"; return; fi
  echo "stage $name: $actions, $jobs at a time, up to ${budget}s of new work"
  timeout -k 10 $((budget + 100)) python3 bench/h200_record_playbook.py --actions "$actions" --jobs "$jobs" \
    --eval-timeout "$eval_timeout" --max-seconds "$budget" $COMMON "$@" > $OUT/r/record_playbook_$name.log 2>&1
  echo "stage $name rc=$?"
  grep -v "INFO autoprofiler" $OUT/r/record_playbook_$name.log | tail -4
}

case ${1:-all} in
cheap) stage cheap sdpa,cudnn_benchmark,autocast_fp16,autocast_bf16 6 120 ;;
compile) stage compile compile_cudagraphs,channels_last_compile 6 180 ;;
autotune) stage autotune compile_max_autotune,compile_coordinate_descent 3 300 ;;
loose) stage loose tf32,autocast_fp16,autocast_bf16 6 120 --atol 1e-2 --rtol 1e-2 \
    --recording $OUT/r/loose_tol1e-2 ;;
all)
  stage cheap sdpa,cudnn_benchmark,autocast_fp16,autocast_bf16 6 120
  stage compile compile_cudagraphs,channels_last_compile 6 180
  stage autotune compile_max_autotune,compile_coordinate_descent 3 300 ;;
*) echo "usage: bash bench/h200_record_playbook.sh all|cheap|compile|autotune|loose" >&2; exit 2 ;;
esac
compact_and_finish $REC
tar czf $OUT/r.tgz -C $OUT r
