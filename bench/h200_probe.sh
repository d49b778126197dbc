#!/usr/bin/env bash
# A first look at the lent H200: environment, GPU tests, one ncu profile, a short identity sweep.
# Run on the device machine from the repo root; writes logs under $OUT.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
{
  date; uname -r; nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv
  ncu --version | tail -1; python3 -c 'import torch,triton;print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
  grep RmProfilingAdminOnly /proc/driver/nvidia/params
} > $OUT/env.txt 2>&1
cat $OUT/env.txt
timeout 200 python3 -m pytest -x -q -m gpu -p no:cacheprovider tests/test_evaluation_gpu.py 2>&1 | tail -30 > $OUT/gpu_eval.txt; cat $OUT/gpu_eval.txt
timeout 120 python3 -m autoprofiler profile datasets/suite/l1/matmul_square.py --groups root,memory --source ncu --device cuda > $OUT/profile.txt 2>&1; tail -40 $OUT/profile.txt
timeout 150 python3 -m pytest -x -q -m gpu -p no:cacheprovider tests/test_profiling_gpu.py 2>&1 | tail -30 > $OUT/gpu_prof.txt; cat $OUT/gpu_prof.txt
