#!/usr/bin/env bash
# The H200 call for issue 9 part 6: the rule-action sweep over the suite through one GpuWorker (Ray
# carried as in ../shared/reference/ray-on-h200.md: /tmp/w holds the first part and the small wheels),
# then the same sweep through the thread pool of the code before the runtime (e9cf6ff, unpacked in
# .old/), each with the GPU's utilization sampled. Results under $OUT.
set -uo pipefail
ROOT=$PWD
cat /tmp/w/ray.part.aa .whl2/ray.part.ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  /tmp/ray-2.60.0-*.whl /tmp/w/*.whl || exit 1
export PYTHONPATH=/tmp/site:$ROOT RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
TRIALS="--timing-trials 100 --warmup 10 --correctness 5"
# 1. the runtime: one GpuWorker actor, 6 candidates at once (timing exclusive), every action x 45 tasks
python3 bench/ray_sweep.py live --device cuda --task-size full --workers 1 --concurrency 6 $TRIALS \
  --gpu-sample --out $OUT/new 2>&1 | grep -v "^cells:" | tail -20
rm -rf /tmp/torchinductor_* 2>/dev/null
# 2. before: the same sweep through the old record()'s thread pool (6 jobs), GPU sampled alike
nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > $OUT/old_util.txt &
SMI=$!
start=$(date +%s.%N)
(cd .old && PYTHONPATH=$ROOT/.old python3 workflows/oracle_sweep.py --out /tmp/oldrec \
  --tasks $ROOT/datasets/suite --evaluate-only --jobs 6 --timing-trials 100 --warmup 10 \
  --correctness-trials 5 > $OUT/old.log 2>&1)
end=$(date +%s.%N)
kill $SMI
echo "old thread pool: $(echo "$end - $start" | bc) s" | tee $OUT/old_seconds.txt
tar -C /tmp/oldrec -cf $OUT/old_rewards.tar rewards
tail -3 $OUT/old.log
