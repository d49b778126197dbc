#!/usr/bin/env bash
# H200 session B: identity noise floor over the whole suite, then a live recording (every ncu group,
# every rule action) of 24 suite tasks for the replay environment. From the repo root on the device:
#   bash bench/h200_session_b.sh      # results in $OUT/b.tgz
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; R=$OUT/r; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp "identity throughput"
timeout 175 python3 bench/eval_throughput.py --device cuda --size full --trials 100 --repeats 1 \
  --out $R/eval_throughput_cuda.md > $R/eval_throughput.log 2>&1; tail -16 $R/eval_throughput.log
stamp "recording"
TASKS=matmul_square,matmul_rect_bf16,conv2d,relu,softmax_rows,layernorm,sum_rows,tiny_add,transpose_copy,cumsum_rows,attention_naive,conv_bn_relu,linear_gelu,matmul_bias_softmax,norm_scale_residual,swish_chain,tiny_elementwise_chain,rmsnorm_manual,mlp_block,resnet_basic_block,small_cnn,deep_tiny_mlp,transformer_block_bf16,attention_block
timeout 370 python3 workflows/oracle_sweep.py --out $R/h200_suite --source ncu --device cuda --filter $TASKS \
  --timing-trials 50 --correctness-trials 3 --warmup 5 --jobs 6 --max-seconds 320 > $R/record.log 2>&1
tail -8 $R/record.log
stamp done
tar czf $OUT/b.tgz -C $OUT r
