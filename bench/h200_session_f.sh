#!/usr/bin/env bash
# The H200 steps issues 11 and 13 still need on the GPU. Each step runs only if the call has time left for it
# (DEADLINE_S, default 570); everything lands in $OUT/s.tgz (unpack under /tmp and copy what is kept into
# bench/results/). The steps `before` and `prev` need the trees carried as .before (`mkdir .before && git
# archive e9cf6ff | tar x -C .before`, the single-process evaluator) and .prev (the same with the commit
# before a change). Next session, call 1 (the GPU test of a candidate crowded out beside other
# evaluations, whose candidate now hands its half of the device back between calls; then the recording,
# into the folder of whichever card comes; the sha is typed by the shell, never by hand):
#   AUTOPROFILER_GIT_SHA=$(git rev-parse --short=12 HEAD) AUTOPROFILER_GIT_DIRTY=0 DEADLINE_S=570 \
#     FILTER_SECONDS=5 bash bench/h200_session_f.sh crowded record
# then the recording, call after call (unpack $OUT/rec.tgz over the repo at once: the machine stays warm
# only 30 s; commit after the last call):
#   ... OUT=$OUT SECONDS_LEFT=540 FILTER_SECONDS=5 bash bench/h200_record_generated.sh
# Steps:
#   before    the single-process evaluator (e9cf6ff, carried as .before/) on the same machine: the
#             throughput and identity the hardened evaluator is held to (~1 min; 55.3 s on 2026-12-03)
#   hardened  bench/eval_throughput.py over the suite with --trace (the default transport: the output
#             channel on CUDA): throughput, identity noise, and per evaluation where the time goes
#             (candidate trials, packing, unpacking, comparing) (~2-3 min)
#   prev      the same, with the tree carried as .prev/ (git archive of the commit before a change): the
#             same-machine baseline of a change to the evaluator (~1.5 min)
#   hardened_memfd  the same with --output-transport memfd (a sealed memfd per message; 146.8 s on
#             2026-12-03, when it was the default)
#   tests     tests/test_evaluation_gpu.py (~3 min; 170 s on 2026-12-03)
#   range     the per-group range-replay tests (test_each_group_by_range_replay; ~1.5 min)
#   rowwise   the range-replay test on rowwise_loop_normalize (1,282 kernels; 268 s on 2026-12-03f, passed)
#   memory    tests/test_evaluation_memory_gpu.py (~2.5 min; 142 s on 2026-12-03, 6 of 6 passed)
#   ncu_conc  bench/ncu_concurrency.py: the recording's first chunk with the root group alone, then two
#             copies at once: whether ncu processes may profile side by side on one GPU (~3 min; 1.18x
#             the throughput on an H100 on 2026-12-05, so the recording profiles one process at a time)
#   ncu_build the same chunk and group alone (--copies 0): GPU-built profiles against the recorded host-built
#             rows of that chunk, with the allocator's cache freed before the ncu range (the default) and
#             kept (AUTOPROFILER_PROFILE_FREE_CACHE=0): time and metrics of both (~1.5 min)
#   identity_small  the four launch-bound tasks outside 1.00 +/- 0.03 on 2026-12-03d, 5 identity evaluations
#             each, the candidate as nobody (the default) and as root (AUTOPROFILER_EVAL_DROP_PRIVILEGES=0)
#             (~1 min)
#   identity_trials  the seven tasks outside 1.00 +/- 0.03 on 2026-12-03d/e (four launch-bound ones,
#             layernorm, transpose_copy, conv_bn_relu), 3 identity evaluations each at 100 and at 300
#             trials: whether more calls narrow the identity spread of sub-millisecond tasks, and what
#             they cost a minute (~2 min)
#   crowded   tests/test_evaluation_memory_gpu.py -k crowded: a candidate out of memory at a share shrunk
#             beside another evaluation's reservation is the evaluator's error (~30 s)
#   compile   tests/test_evaluation_gpu.py -k torch_compile: a torch.compile candidate is not flagged (~1 min)
#   record    bench/h200_record_generated.sh with the time left (the generated tasks' recording)
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}; H=/tmp/h; mkdir -p "$OUT" $H/r; T0=$(date +%s); D=${DEADLINE_S:-570}
left() { echo $(( D - ($(date +%s) - T0) )); }
cap() { local want=$1 l; l=$(left); echo $(( l - 15 < want ? l - 15 : want )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; ncu --version | tail -1
  python3 -c "import sys, torch; print(sys.executable, torch.__version__, torch.cuda.get_device_name(0))"; } > $H/env.txt 2>&1
for step in "$@"; do
  L=$(left); echo "== $step at $(( $(date +%s) - T0 ))s, ${L}s left"
  [ "$L" -gt 60 ] || { echo "no time left for $step"; continue; }
  case $step in
  before)
    (cd .before && PYTHONPATH=$PWD timeout -k 5 $(cap 120) python3 bench/eval_throughput.py --device cuda --size full \
      --trials 100 --repeats 1 --out $H/eval_throughput_before.md) > $H/before.log 2>&1
    echo "single-process e9cf6ff rc=$?: $(grep 'per minute' $H/before.log)" ;;
  hardened)
    timeout -k 5 $(cap 240) python3 bench/eval_throughput.py --device cuda --size full --trials 100 --repeats 1 \
      --out $H/eval_throughput_cuda_hardened.md --trace $H/eval_trace_cuda.jsonl > $H/hardened.log 2>&1
    echo "hardened rc=$?: $(grep 'per minute' $H/hardened.log)" ;;
  prev)
    (cd .prev && PYTHONPATH=$PWD timeout -k 5 $(cap 240) python3 bench/eval_throughput.py --device cuda --size full \
      --trials 100 --repeats 1 --out $H/eval_throughput_cuda_prev.md --trace $H/eval_trace_cuda_prev.jsonl) \
      > $H/prev.log 2>&1
    echo "hardened, previous tree rc=$?: $(grep 'per minute' $H/prev.log)" ;;
  hardened_memfd)
    timeout -k 5 $(cap 240) python3 bench/eval_throughput.py --device cuda --size full --trials 100 --repeats 1 \
      --output-transport memfd --out $H/eval_throughput_cuda_memfd.md --trace $H/eval_trace_cuda_memfd.jsonl \
      > $H/hardened_memfd.log 2>&1
    echo "hardened (memfd) rc=$?: $(grep 'per minute' $H/hardened_memfd.log)" ;;
  tests)
    AUTOPROFILER_BENCH_OUT=$H timeout -k 10 $(cap 330) python3 -m pytest -m gpu -rA -v -p no:cacheprovider \
      tests/test_evaluation_gpu.py > $H/eval_gpu_tests.log 2>&1
    echo "gpu tests rc=$?: $(tail -1 $H/eval_gpu_tests.log)"; grep -E "^FAILED" $H/eval_gpu_tests.log | head ;;
  range)
    AUTOPROFILER_BENCH_OUT=$H timeout -k 10 $(cap 150) python3 -m pytest -m gpu -rA -v -p no:cacheprovider \
      tests/test_profiling_gpu.py -k each_group > $H/range_tests.log 2>&1
    echo "range tests rc=$?: $(tail -1 $H/range_tests.log)" ;;
  rowwise)
    AUTOPROFILER_BENCH_OUT=$H timeout -k 10 $(cap 330) python3 -m pytest -m gpu -rA -v -s -p no:cacheprovider \
      tests/test_profiling_gpu.py -k many_kernels > $H/rowwise_test.log 2>&1
    echo "rowwise test rc=$?: $(tail -1 $H/rowwise_test.log)" ;;
  memory)
    AUTOPROFILER_BENCH_OUT=$H timeout -k 10 $(cap 320) python3 -m pytest -m gpu -rA -v -p no:cacheprovider \
      tests/test_evaluation_memory_gpu.py > $H/eval_memory_gpu.log 2>&1
    echo "memory tests rc=$?: $(tail -1 $H/eval_memory_gpu.log)" ;;
  ncu_conc)
    timeout -k 10 $(cap 300) python3 bench/ncu_concurrency.py --tasks datasets/ops_gen/tasks.parquet \
      --ids-from datasets/recorded/h200/profiles --group root --copies 2 --out $H/ncu_concurrency.json \
      > $H/ncu_concurrency.log 2>&1
    echo "ncu concurrency rc=$?"; grep "^|" $H/ncu_concurrency.log; grep "profiled run of" $H/ncu_concurrency.log | head -3 ;;
  ncu_build)
    for free in 1 0; do
      AUTOPROFILER_PROFILE_FREE_CACHE=$free timeout -k 10 $(cap 150) python3 bench/ncu_concurrency.py \
        --tasks datasets/ops_gen/tasks.parquet --ids-from datasets/recorded/h200/profiles --group root \
        --copies 0 --out $H/ncu_build_free$free.json > $H/ncu_build_free$free.log 2>&1
      echo "ncu build (GPU-built; allocator cache freed before the range: $free) rc=$?"; grep "^|" $H/ncu_build_free$free.log
    done ;;
  identity_small)
    for drop in 1 0; do
      AUTOPROFILER_EVAL_DROP_PRIVILEGES=$drop timeout -k 5 $(cap 120) python3 bench/eval_throughput.py --device cuda \
        --size full --trials 100 --repeats 5 --only tiny_elementwise_chain,embedding_gather,tiny_add,conv2d \
        --out $H/identity_small_drop$drop.md --trace $H/identity_small_drop$drop.jsonl > $H/identity_small_drop$drop.log 2>&1
      echo "identity, 4 launch-bound tasks x 5, candidate as nobody: $drop rc=$?: $(grep 'per minute' $H/identity_small_drop$drop.log)"
      grep -E "^  suite/" $H/identity_small_drop$drop.log
    done ;;
  identity_trials)
    for trials in 100 300; do
      timeout -k 5 $(cap 120) python3 bench/eval_throughput.py --device cuda --size full --trials $trials \
        --repeats 3 --only tiny_elementwise_chain,embedding_gather,tiny_add,conv2d,layernorm,transpose_copy,conv_bn_relu \
        --out $H/identity_trials$trials.md > $H/identity_trials$trials.log 2>&1
      echo "identity, 7 tasks x 3, $trials trials rc=$?: $(grep 'per minute' $H/identity_trials$trials.log)"
      grep -E "^  suite/" $H/identity_trials$trials.log
    done ;;
  crowded)
    AUTOPROFILER_BENCH_OUT=$H timeout -k 10 $(cap 150) python3 -m pytest -m gpu -rA -v -p no:cacheprovider \
      tests/test_evaluation_memory_gpu.py -k crowded > $H/crowded_test.log 2>&1
    echo "crowded-out test rc=$?: $(tail -1 $H/crowded_test.log)" ;;
  compile)
    AUTOPROFILER_BENCH_OUT=$H timeout -k 10 $(cap 150) python3 -m pytest -m gpu -rA -v -p no:cacheprovider \
      tests/test_evaluation_gpu.py -k torch_compile > $H/compile_test.log 2>&1
    echo "torch.compile test rc=$?: $(tail -1 $H/compile_test.log)" ;;
  record)  # into $OUT itself, where its rec.tgz is packed every 30 s (s.tgz is made only at the end)
    OUT=$OUT SECONDS_LEFT=$(( $(left) - 20 )) bash bench/h200_record_generated.sh ;;
  *) echo "unknown step $step" ;;
  esac
done
tar czf "$OUT/s.tgz" -C $H . ; echo "done at $(( $(date +%s) - T0 ))s ($(du -sh "$OUT/s.tgz" | cut -f1))"
