#!/usr/bin/env bash
# The recording of generated tasks (issue 11) on the H200 or, when the device tool lends an H100, into
# datasets/recorded/h100 (below); one resumable call at a time:
#   OUT=/tmp/out SECONDS_LEFT=480 bash bench/h200_record_generated.sh
# 1. the GPU time filter (eager 1-100 ms at full size) on the tasks of datasets/recorded/h200/selection.txt
#    not judged yet, continuing datasets/ops_gen/gpu_verdicts.jsonl;
# 2. workflows/oracle_sweep.py with datasets/recorded/h200/record.yaml, its filter narrowed to the tasks
#    that passed, --resume: 16 tasks at a time (`chunk`), every ncu group in its own profiled process per chunk
#    (passes measured per group), then the rule actions of those tasks; stops starting work at the budget.
# 3. `autoprofiler compact` on the recording (each run's parts as one file) before the last pack.
# REQUIRE_GPU=H200: exit at once (nothing recorded) unless the GPU's name contains it, so a call that the
# device tool serves with another card costs only its start.
# NEW_TASKS=0: record only the tasks this card's recording already holds rows of (finish them; leave the
# selection's new tasks to the other card).
# RESERVE_FOR_H200=70 (default): a card other than the H200 starts new tasks only while more than this
# many selected tasks that passed the filter stay free of every card (the H200 needs 60 more for 300).
# CELL_GRACE=90 (default): seconds the recorder's evaluations in flight at its max_seconds get to finish
# before it is killed. The recorder starts no cell that the longest so far says would end past
# max_seconds, but the first wave of a call starts before any has ended (a large task's cell takes a
# minute or more; a killed cell is evaluated again later).
# DROP_ERROR="out of memory": first drop this card's reward rows whose error contains it (an evaluator
# fault since fixed), so step 2 evaluates them again; run bench/drop_reward_rows.py the same way here.
# Then here: `bash bench/unpack_recording.sh <files_at>/rec.tgz` (datasets/recorded/<card>, datasets/ops_gen/gpu_verdicts.*)
# and commit BEFORE the next call: the device works on a copy of this tree, so a call started before the
# last one's rows are unpacked here measures those cells again (261 cells twice on 2026-12-06).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
START=$(date +%s); BUDGET=${SECONDS_LEFT:-480}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# One recording per GPU model, so a task's rows all come from one card: an H200 continues
# datasets/recorded/h200; an H100 records into datasets/recorded/h100 (made here from the H200's
# selection and settings). Either records only the selected tasks no other card's recording holds a row of.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ -n "${REQUIRE_GPU:-}" ] && [[ "$GPU" != *"$REQUIRE_GPU"* ]]; then
  echo "GPU $GPU is not the required $REQUIRE_GPU: nothing recorded"; exit 0
fi
case "$GPU" in
  *H200*) REC=datasets/recorded/h200 ;;
  *H100*) REC=datasets/recorded/h100 ;;
  *) echo "no recording folder for the GPU '$GPU' (an H200 or an H100 is expected)"; exit 2 ;;
esac
if [ "$REC" != datasets/recorded/h200 ]; then  # one selection for every card: the H200's
  mkdir -p $REC && cp datasets/recorded/h200/selection.txt $REC/
fi
if [ ! -f $REC/record.yaml ]; then
  sed "s#^out_dir: .*#out_dir: $REC#; s#^\# The H200 recording#\# The $GPU recording#" \
    datasets/recorded/h200/record.yaml > $REC/record.yaml
fi
echo "GPU $GPU: recording into $REC"
source bench/lib_last_call.sh
check_last_call $REC || exit 2
if [ -n "${DROP_ERROR:-}" ] && [ -d $REC/rewards ]; then
  python3 bench/drop_reward_rows.py $REC/rewards --error-contains "$DROP_ERROR" | tail -3
fi
FILTER_S=${FILTER_SECONDS:-90}
timeout -k 5 $((FILTER_S + 30)) python3 datasets/ops_gen/filter_gpu.py --stage time --device cuda \
  --only $REC/selection.txt --max-seconds "$FILTER_S" --timeout 60 > "$OUT/filter_time.log" 2>&1
echo "time filter rc=$?: $(tail -1 "$OUT/filter_time.log")"
python3 - "$REC" <<'PY' || exit 2
import json, os, sys
from pathlib import Path
import pyarrow.dataset as ds
from autoprofiler.generate.verdicts import read_verdicts
rec = Path(sys.argv[1])
verdicts = read_verdicts("datasets/ops_gen/gpu_verdicts.jsonl")
ok = {h for (h, stage), row in verdicts.items() if stage == "time" and row["ok"]}
ids = [ln.split("\t")[0] for ln in (rec / "selection.txt").read_text().splitlines()
       if ln and not ln.startswith("#") and ln.split("\t")[1] in ok]
def profiled(profiles: Path) -> set:
    """The task ids a recording's profile table holds a row of."""
    return set(ds.dataset(profiles, format="parquet", partitioning="hive")
               .to_table(columns=["task_id"]).column("task_id").to_pylist())
held = set()  # a task's rows all come from one card: skip tasks another card's recording holds a row of
for other in Path("datasets/recorded").glob("*/profiles"):
    if other.parent != rec:
        held |= profiled(other)
ids = [i for i in ids if i not in held]
mine = profiled(rec / "profiles") if (rec / "profiles").is_dir() else set()
if os.environ.get("NEW_TASKS", "1") == "0":
    if not mine:
        sys.exit(f"NEW_TASKS=0: {rec} holds no profiles yet, so there is no task to finish")
    ids = [i for i in ids if i in mine]
elif rec.name != "h200":  # leave the H200 the free tasks it still needs
    reserve = int(os.environ.get("RESERVE_FOR_H200", "70"))
    new = [i for i in ids if i not in mine]
    take = set(new[: max(0, len(new) - reserve)])
    print(f"{len(new)} free tasks: {len(take)} may start here, {len(new) - len(take)} stay for the H200")
    ids = [i for i in ids if i in mine or i in take]
text = (rec / "record.yaml").read_text().splitlines()
text = [f"filter: {json.dumps(ids)}" if ln.startswith("filter:") else ln for ln in text]
Path("/tmp/record_generated.yaml").write_text("\n".join(text) + "\n")
print(f"{len(ids)} selected tasks passed the time filter")
PY
# $OUT/rec.tgz: what is recorded, packed every 30 s while the recording runs and once at the end
source bench/lib_pack.sh
start_packing "$OUT/rec.tgz" $REC datasets/ops_gen/gpu_verdicts.jsonl datasets/ops_gen/gpu_verdicts.parquet
GRACE=${CELL_GRACE:-90}
BUDGET_REC=$(( $(left) - GRACE - 15 ))
if [ "$BUDGET_REC" -gt 60 ]; then
  mark_last_call $REC  # packed with the rows, from the first pack on
  timeout -k 10 $((BUDGET_REC + GRACE)) python3 workflows/oracle_sweep.py --config /tmp/record_generated.yaml \
    --resume max_seconds=$BUDGET_REC > "$OUT/record_generated.log" 2>&1
  echo "record rc=$?"; grep -v "ncu: profiling:" "$OUT/record_generated.log" | grep -v "^\s" | tail -12
else
  echo "no time left to record"
fi
compact_and_finish $REC
