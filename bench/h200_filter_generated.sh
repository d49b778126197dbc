#!/usr/bin/env bash
# GPU filters of the generated table datasets/ops_gen/tasks.parquet on the H200 (written and smoke-tested
# on CPU with --device cpu; not yet run on a GPU). Ops-6K keeps a task when its eager forward takes
# 1-100 ms on the GPU and it runs under torch.compile. Resumable: each call continues the verdict log
# datasets/ops_gen/gpu_verdicts.jsonl (copied to $OUT first), sends no task after MAX_SECONDS, and
# leaves $OUT/gpu_verdicts.jsonl + $OUT/gpu_verdicts.parquet: copy both back to datasets/ops_gen/ and
# commit before the next call. Repeat each stage until it prints "remaining 0".
#   OUT=/tmp/out bash bench/h200_filter_generated.sh time      # eager time, one process, the GPU alone
#   OUT=/tmp/out bash bench/h200_filter_generated.sh compile   # torch.compile, WORKERS processes (default 12)
# The compile stage takes only tasks whose time passed; inductor compiles on the CPU, one thread per
# worker (TORCHINDUCTOR_COMPILE_THREADS=1), each worker limited to 0.9/WORKERS of the GPU's memory
# (an out-of-memory task is retried with the GPU to itself).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f datasets/ops_gen/gpu_verdicts.jsonl ] && cp datasets/ops_gen/gpu_verdicts.jsonl "$OUT/"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
case ${1:-time} in
time)
  timeout -k 10 570 python3 datasets/ops_gen/filter_gpu.py --stage time --device cuda \
    --verdicts "$OUT/gpu_verdicts.jsonl" --max-seconds "${MAX_SECONDS:-480}" --timeout 60 \
    2>&1 | tee "$OUT/filter_time.log" | tail -30 ;;
compile)
  timeout -k 10 570 python3 datasets/ops_gen/filter_gpu.py --stage compile --device cuda \
    --workers "${WORKERS:-12}" --verdicts "$OUT/gpu_verdicts.jsonl" --max-seconds "${MAX_SECONDS:-330}" \
    --timeout 200 2>&1 | tee "$OUT/filter_compile.log" | tail -30 ;;
*) echo "usage: bash bench/h200_filter_generated.sh time|compile" >&2; exit 2 ;;
esac
