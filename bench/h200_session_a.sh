#!/usr/bin/env bash
# H200 session A: evaluator GPU tests, identity throughput/noise floor, profiler GPU tests (captures),
# profiling cost table. Run from the repo root on the device machine (python3 has torch, no ray):
#   bash bench/h200_session_a.sh      # results in $OUT/a.tgz (unpack into the repo: see bench/README.md)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
{ date -u; uname -r; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  ncu --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__)'; } > $R/env.txt 2>&1
stamp "evaluator GPU tests"
AUTOPROFILER_BENCH_OUT=$R timeout 150 python3 -m pytest tests/test_evaluation_gpu.py -v -p no:cacheprovider \
  -k "not fault_corpus" > $R/eval_gpu_tests.log 2>&1; tail -3 $R/eval_gpu_tests.log
stamp "identity throughput"
timeout 170 python3 bench/eval_throughput.py --device cuda --size full --trials 100 --repeats 1 \
  --out $R/eval_throughput_cuda.md > $R/eval_throughput.log 2>&1; tail -12 $R/eval_throughput.log
stamp "profiler GPU tests"
AUTOPROFILER_CAPTURE_DIR=$R/ncu_h200 timeout 110 python3 -m pytest -q -m gpu tests/test_profiling_gpu.py \
  -p no:cacheprovider > $R/profiling_gpu_tests.log 2>&1; tail -3 $R/profiling_gpu_tests.log
stamp "profiling cost"
timeout 130 python3 bench/profile_cost.py --tasks 4 --budget-s 100 --out $R/profile_cost_h200 \
  --costs $R/group_costs.json > $R/profile_cost.log 2>&1; tail -25 $R/profile_cost.log
stamp done
tar czf $OUT/a.tgz -C $OUT r
