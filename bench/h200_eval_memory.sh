#!/usr/bin/env bash
# The evaluator's memory plan (issue 11) on the H200: tests/test_evaluation_memory_gpu.py (a quarter of
# the GPU per forward, issue 11's RMSNorm, generated tasks sized by memory, the candidate's cap, a task
# too large). Run it alone on the GPU: the tasks are sized from its total memory. About 5 minutes.
#   OUT=/tmp/out bash bench/h200_eval_memory.sh
# Writes to $OUT: env.txt, eval_memory_gpu.log, eval_memory_gpu.json (per-test plans and times).
# Then run bench/h200_eval_hardening.sh for the other GPU tests and the identity bench (small tasks).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; free -g
  python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0), torch.cuda.mem_get_info())"
} > "$OUT/env.txt" 2>&1
AUTOPROFILER_BENCH_OUT=$OUT timeout -k 10 540 python3 -m pytest -m gpu -rA -v -p no:cacheprovider \
  tests/test_evaluation_memory_gpu.py > "$OUT/eval_memory_gpu.log" 2>&1
echo "memory gpu tests rc=$? ($(tail -1 "$OUT/eval_memory_gpu.log"))"
