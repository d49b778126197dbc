#!/usr/bin/env bash
# Issue 14 on a multi-GPU kind of the device tool (nvidia-h200-x4, or -x2: then --workers 1,2): the oracle
# sweep's rule actions over 50 tasks (bench/multigpu_gpu.yaml) with 1, 2 and 4 GpuWorker actors, one per
# GPU. Ray is not installed there and its wheel is larger than one call carries
# (../shared/reference/ray-on-h200.md), so:
#   here, once:                     bash bench/multigpu_session.sh wheels      # .whl/ and .whl2/ (git-ignored)
#   call 1, carry [".whl"]:         bash bench/multigpu_session.sh stash       # the first part into /tmp/w
#   call 2, carry [".whl2"]:        OUT=$OUT ONLY=1 bash bench/multigpu_session.sh run     # ~5-6 min
#   call 3 (no carry):              OUT=$OUT ONLY=2,4 bash bench/multigpu_session.sh run   # ~4-5 min
# Calls 2 and 3 must follow at once (the machine stays warm 30 s): /tmp/w, /tmp/site and the runs
# (/tmp/mg) live there between calls. Each run call brings back $OUT/mg.tgz (every run so far); here:
#   mkdir -p bench/results && tar xzf <files_at>/mg.tgz -C bench/results
#   python bench/multigpu.py --table --workers 1,2,4 --agree-with datasets/recorded/h200 --out bench/results/multigpu
# The sweep's tasks are ones the card's own recording holds complete (bench/multigpu_gpu.yaml on an H200,
# bench/multigpu_gpu_h100.yaml on an H100), so --agree-with compares every setting with that recording.
# On the lent one-GPU kind (issue 14's meanwhile step) calls 1 and 2 run the one-worker setting alone
# (ONLY=1; ~5 min for 250 cells); then here, with the card's recording:
#   tar xzf <files_at>/mg.tgz -C /tmp && mv /tmp/multigpu_runs bench/results/multigpu_1gpu_h100_runs
#   python bench/multigpu.py --table --workers 1 --agree-with datasets/recorded/h100 --out bench/results/multigpu_1gpu_h100
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
# NVLink multicast stays off in every process (the device's KINDS.md): Ray's workers and the evaluator's
# sandboxes inherit these (evaluation.workers.PASSTHROUGH_PREFIXES)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case ${1:-} in
wheels)  # here: Ray 2.60 and the few wheels the image lacks, unpacked, trimmed and split to fit two calls
  # beside the working tree (each call carries at most 64 MiB in all): the Java jars, RLlib and Ray LLM
  # are not needed by GpuWorker actors or Ray Data, and xz packs the rest into ~27 MB
  RW=$(mktemp -d); rm -rf .whl .whl2; mkdir -p .whl .whl2 "$RW/site"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$RW" ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py || exit 1
  python3 - "$RW" <<'PY' || exit 1
import glob, os, sys, zipfile
site = os.path.join(sys.argv[1], "site")
for wheel in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    archive = zipfile.ZipFile(wheel)
    for info in archive.infolist():  # keep the executable bit of gcs_server, raylet and friends
        path = archive.extract(info, site)
        mode = (info.external_attr >> 16) & 0o777
        if mode & 0o111:
            os.chmod(path, mode | 0o644)
PY
  rm -rf "$RW"/site/ray/jars "$RW"/site/ray/rllib "$RW"/site/ray/llm
  tar cf - -C "$RW/site" . | xz -T4 -9 > "$RW/site.tar.xz" && split -n 2 "$RW/site.tar.xz" .whl/site.part.
  mv .whl/site.part.ab .whl2/ && rm -rf "$RW"
  ls -la .whl .whl2 ;;
stash)
  mkdir -p /tmp/w && cp .whl/* /tmp/w/ && ls /tmp/w && nvidia-smi -L ;;
run)
  if [ ! -d /tmp/site/ray ]; then
    cat /tmp/w/site.part.aa .whl2/site.part.ab | python3 -c "import sys, tarfile; \
tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/site', filter='fully_trusted')" || exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD
  # Ray and Ray Data (the sweep's table writes) import and write here, before minutes are spent
  python3 -c "import ray, ray.data; ray.init(num_cpus=2, include_dashboard=False); \
ray.data.from_items([{'a': 1}]).write_parquet('/tmp/ray_smoke'); print('ray', ray.__version__, 'ok')" \
    2>&1 | tail -3
  GPUS=$(nvidia-smi -L | wc -l); echo "GPUs: $GPUS"; nvidia-smi -L
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H100*) CONFIG=bench/multigpu_gpu_h100.yaml ;;  # tasks the H100 recording holds
    *) CONFIG=bench/multigpu_gpu.yaml ;;            # tasks the H200 recording holds
  esac
  case $GPUS in 1) WORKERS=1 ;; 2|3) WORKERS=1,2 ;; *) WORKERS=1,2,4 ;; esac
  ONLY=$(echo "${ONLY:-$WORKERS}" | tr , '\n' | grep -xF -f <(echo "$WORKERS" | tr , '\n') | paste -sd,)
  [ -n "$ONLY" ] || { echo "nothing to run on $GPUS GPUs"; exit 2; }
  echo "config $CONFIG, settings $WORKERS, now $ONLY"
  timeout -k 10 ${SECONDS_LEFT:-560} python3 bench/multigpu.py --config $CONFIG \
    --workers $WORKERS --only "$ONLY" --out /tmp/mg/multigpu 2>&1 | tail -20
  echo "bench rc=${PIPESTATUS[0]}"
  tail -15 /tmp/mg/multigpu_runs/w*.log
  # the runs' tables, logs and timings (the candidates' sources stay there)
  tar czf "$OUT/mg.tgz" -C /tmp/mg --exclude=candidates multigpu_runs ;;
*)
  echo "usage: bash bench/multigpu_session.sh wheels|stash|run (see the header)"; exit 2 ;;
esac
