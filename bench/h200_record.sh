#!/usr/bin/env bash
# Continue the live H200 recording in datasets/h200_suite (every ncu group in one profiled process per
# batch, then every rule action, 6 candidates at a time with exclusive timing). Resumable: run it again
# until datasets/h200_suite/summary.json says "complete": true. From the repo root on the device:
#   bash bench/h200_record.sh         # then unpack $OUT/rec.tgz over datasets/ here and commit
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TASKS=matmul_square,matmul_rect_bf16,conv2d,relu,softmax_rows,layernorm,sum_rows,tiny_add,transpose_copy,cumsum_rows,attention_naive,conv_bn_relu,linear_gelu,matmul_bias_softmax,norm_scale_residual,swish_chain,tiny_elementwise_chain,rmsnorm_manual,mlp_block,resnet_basic_block,small_cnn,deep_tiny_mlp,transformer_block_bf16,attention_block
timeout ${RECORD_TIMEOUT:-540} python3 workflows/oracle_sweep.py --out datasets/h200_suite --source ncu --device cuda \
  --filter $TASKS --timing-trials 50 --correctness-trials 3 --warmup 5 --jobs 6 --joint \
  --max-seconds ${RECORD_SECONDS:-420} 2>&1 | tee $OUT/record.log | grep -v "^\s" | tail -20
tar czf $OUT/rec.tgz datasets/h200_suite
