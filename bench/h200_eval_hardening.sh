#!/usr/bin/env bash
# Evaluator hardening (issue 13) on the H200: the GPU tests, then throughput and identity noise of the
# suite with the hardened evaluator, then (where the copy has .git) the same bench at e9cf6ff, the
# single-process evaluator, on the same machine (carry .before: the e9cf6ff tree). About 7-8 minutes; every step has its own timeout.
#   OUT=/tmp/out bash bench/h200_eval_hardening.sh
# Writes to $OUT: env.txt, eval_gpu_tests.log + eval_gpu_tests.json (pytest; per-test numbers),
# eval_throughput_cuda_hardened.{md,json,log}, and eval_throughput_cuda_before.{md,json,log} when run.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; id; ls -l /dev/nvidia* | head -5
  python3 -c "import sys, torch; print(sys.executable, torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
AUTOPROFILER_BENCH_OUT=$OUT timeout -k 10 320 python3 -m pytest -m gpu -rA -p no:cacheprovider \
  tests/test_evaluation_gpu.py > "$OUT/eval_gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(tail -1 "$OUT/eval_gpu_tests.log"))"
timeout -k 10 120 python3 bench/eval_throughput.py --device cuda --size full --trials 100 --repeats 1 \
  --out "$OUT/eval_throughput_cuda_hardened.md" > "$OUT/eval_throughput_cuda_hardened.log" 2>&1
echo "hardened bench rc=$?: $(grep 'per minute' "$OUT/eval_throughput_cuda_hardened.log")"
BEFORE=""
if [ -d .before/autoprofiler ]; then  # carried: `git archive e9cf6ff autoprofiler bench/eval_throughput.py datasets/suite | tar -x -C .before`
  BEFORE=$PWD/.before
elif git rev-parse --verify -q e9cf6ff >/dev/null 2>&1; then
  rm -rf /tmp/eval_before && mkdir -p /tmp/eval_before && git archive e9cf6ff | tar -x -C /tmp/eval_before
  BEFORE=/tmp/eval_before
fi
if [ -n "$BEFORE" ]; then
  (cd "$BEFORE" && PYTHONPATH=$BEFORE timeout -k 10 100 python3 bench/eval_throughput.py \
    --device cuda --size full --trials 100 --repeats 1 --out "$OUT/eval_throughput_cuda_before.md") \
    > "$OUT/eval_throughput_cuda_before.log" 2>&1
  echo "before bench rc=$?: $(grep 'per minute' "$OUT/eval_throughput_cuda_before.log")"
else
  echo "no e9cf6ff tree here: compare with bench/results/eval_throughput_cuda.md (42.9/min, 2026-12-02)"
fi
