#!/usr/bin/env bash
# Here, after a bench/device_next.sh call: unpack its recordings in the order its steps ran and keep its logs.
#   bash bench/device_unpack.sh <files_at> <tag>      # tag names the call in the logs, e.g. 2026-12-09a
# Logs go beside the recording each step wrote: datasets/recorded/<card>/logs (record, playbook) or
# datasets/h200_suite/logs (suite_range), as device_<tag>_<N>_<step>[_<log>].log. Then commit before the
# next call.
set -eu
FROM=${1:?usage: bash bench/device_unpack.sh FILES_AT TAG}
TAG=${2:?usage: bash bench/device_unpack.sh FILES_AT TAG}
[ -f "$FROM/gpu.txt" ] || { echo "error: $FROM holds no gpu.txt: not the files of a bench/device_next.sh call" >&2; exit 2; }
case "$(cat "$FROM/gpu.txt")" in
  *H200*) card=h200 ;;
  *H100*) card=h100 ;;
  *) echo "error: no recording for the GPU '$(cat "$FROM/gpu.txt")'" >&2; exit 2 ;;
esac
for dir in $(find "$FROM" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*_*' | sort -V); do
  name=$(basename "$dir"); step=${name#*_}
  case $step in suite_range) logs=datasets/h200_suite/logs ;; *) logs=datasets/recorded/$card/logs ;; esac
  mkdir -p "$logs"
  if [ -f "$dir/rec.tgz" ]; then bash bench/unpack_recording.sh "$dir/rec.tgz"; fi
  for log in "$dir"/*.log "$dir"/r/*.log; do
    [ -f "$log" ] || continue
    base=$(basename "$log" .log); suffix=$([ "$base" = step ] && echo "" || echo "_$base")
    cp "$log" "$logs/device_${TAG}_${name}${suffix}.log"
  done
  echo "$name: logs in $logs"
done
