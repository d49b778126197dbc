#!/usr/bin/env bash
# Third H200 session (2026-12-02): finish the profile cost table, then record the whole suite (every
# ncu group, every rule action) into datasets/h200_suite. Stage "a": cost table + recording start;
# stage "b": continue the recording (run again until summary.json says complete). From the repo root:
#   OUT=/tmp/out bash bench/h200_session_c.sh a     # then unpack $OUT/rec.tgz over datasets/ here
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/r
stage=${1:-b}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > $OUT/r/env_$stage.txt 2>&1
if [ "$stage" = a ]; then
  timeout -k 5 ${COST_TIMEOUT:-200} python3 bench/profile_cost.py --tasks 4 --budget-s 110 \
    --only tensor_cores,instruction_mix,flops,configs,full --merge bench/results/profile_cost_h200.json \
    --out $OUT/r/profile_cost_h200 --costs autoprofiler/profiling/group_costs.json 2>&1 | tail -15
  cp autoprofiler/profiling/group_costs.json $OUT/r/
fi
timeout -k 10 ${RECORD_TIMEOUT:-380} python3 workflows/oracle_sweep.py --out datasets/h200_suite --source ncu \
  --device cuda --timing-trials 50 --correctness-trials 3 --warmup 5 --jobs 6 --joint --joint-batch 8 \
  --eval-timeout 120 ${RECORD_EXTRA:-} --max-seconds ${RECORD_SECONDS:-280} > $OUT/r/record_$stage.log 2>&1
echo "record rc=$?"
grep -v "^\s" $OUT/r/record_$stage.log | grep -v "INFO autoprofiler.profiling.ncu: profiling:" | tail -25
tar czf $OUT/rec.tgz --exclude=.timing.lock datasets/h200_suite
tar czf $OUT/r.tgz -C $OUT r
