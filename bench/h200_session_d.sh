#!/usr/bin/env bash
# Next H200 session (prepared 2026-12-02, not yet run): finish datasets/h200_suite and the live optimize.
#   OUT=/tmp/out bash bench/h200_session_d.sh range      # the many-kernel range-replay GPU test, alone
#     (RANGE_TESTS=range_replay runs all ten; the nine per-group ones passed on the H200 on 2026-12-03 and
#     2026-12-07 in about 280 s; the many-kernel one passed there in 264 s on 2026-12-03 and limits of
#     160-330 s have stopped it since)
#   OUT=/tmp/out bash bench/h200_session_d.sh record     # the 13 many-kernel tasks, range replay; resumable
#   OUT=/tmp/out bash bench/h200_session_d.sh optimize   # live optimize over the suite (seed tree, rule)
# Then here: unpack $OUT/rec.tgz over datasets/, run
#   python workflows/oracle_sweep.py --out datasets/h200_suite --analyse-only --report reports/h200_suite
# and the replay training of datasets/h200_suite/HISTORY.md.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT/r
case ${1:-range} in
range)
  AUTOPROFILER_CAPTURE_DIR=$OUT/r/capture timeout -k 5 ${RANGE_SECONDS:-540} python3 -m pytest -q -s -m gpu \
    tests/test_profiling_gpu.py -k "${RANGE_TESTS:-many_kernels}" -p no:cacheprovider 2>&1 | tail -20 \
    | tee $OUT/r/range_test.log
  tar czf $OUT/r.tgz -C $OUT r ;;
record)  # profiles only: every rule action is already recorded for all 45 tasks
  source bench/lib_pack.sh  # $OUT/rec.tgz packed every 30 s and at the end: a stopped call loses no part
  start_packing "$OUT/rec.tgz" datasets/h200_suite
  timeout -k 10 ${RECORD_TIMEOUT:-560} python3 workflows/oracle_sweep.py --out datasets/h200_suite --source ncu \
    --device cuda --joint --joint-batch 2 --range-replay-above ${RANGE_ABOVE:-32} \
    --filter "$(python3 bench/device_plan.py --many-kernel-tasks)" \
    --timing-trials 50 --correctness-trials 3 --warmup 5 --jobs 6 --eval-timeout 120 \
    --max-seconds ${RECORD_SECONDS:-420} > $OUT/r/record_e.log 2>&1
  echo "record rc=$?"; grep -v "ncu: profiling:" $OUT/r/record_e.log | grep -v "^\s" | tail -20
  finish_packing
  tar czf $OUT/r.tgz -C $OUT r ;;
optimize)  # routes on the recorded ncu profiles (their recorded cost), rewrites and evaluates live
  timeout -k 10 560 python3 -m autoprofiler.cli optimize datasets/suite --tree trees/seed.json --source ncu \
    --device cuda --profiles datasets/h200_suite --jobs 6 --trials 50 \
    --out $OUT/r/optimize_h200_suite.md --out $OUT/r/optimize_h200_suite.json 2>&1 | tail -50
  tar czf $OUT/r.tgz -C $OUT r ;;
esac
