"""Choose the generated tasks the H200 recording takes, and write its recording config.

    python bench/select_generated.py            # writes datasets/recorded/h200/selection.txt + record.yaml

Rule (fixed before any of them was recorded): from ``datasets/ops_gen/tasks.parquet``, tasks whose
*estimated* full-size eager time is at most 4 ms and estimated peak memory at most 3 GiB (a device call
profiles every group of a chunk of tasks in minutes, not hours), taken round-robin over the number of
composed operators (``torch#1`` .. ``torch#5``), each tier in content-hash order, until ``--count``.
That pool holds 551 tasks; past them the same rule continues with a peak-memory bound of 6 GiB (still a
quarter of an H100's memory at most, which the evaluator's memory sizing handles), so a larger count
appends and never reorders what was chosen before. Neither bound looks at a recorded outcome.
The GPU time filter (``datasets/ops_gen/filter_gpu.py --only selection.txt``) then keeps those whose
*measured* eager time is 1-100 ms; ``bench/h200_record_generated.sh`` records those, chunk by chunk.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TABLE = ROOT / "datasets" / "ops_gen" / "tasks.parquet"
OUT = ROOT / "datasets" / "recorded" / "h200"
MAX_EST_MS = 4.0
MAX_EST_GIB = (3.0, 6.0)  # the peak-memory bound of each pool, taken in order

CONFIG = """\
# The H200 recording of generated tasks (written by bench/select_generated.py; run by
# bench/h200_record_generated.sh, which narrows `filter` to the tasks whose GPU time filter passed).
# Keys and their meaning: workflows/oracle_sweep.yaml. Evaluation settings as datasets/h200_suite's.
out_dir: datasets/recorded/h200
tasks: datasets/ops_gen/tasks.parquet
filter: {filter}
source: ncu
device: cuda
task_size: full
eval: {{timing_trials: 50, warmup: 5, correctness_trials: 3, timeout_s: 180.0}}
joint: false
chunk: 16
range_replay_above: 64
runtime: {{ray: false, workers: null, concurrency: 6}}
"""


def select(rows: list[dict], count: int) -> list[dict]:
    """The rule of the module docstring: each memory bound's pool, round-robin over tiers, until ``count``."""
    chosen: list[dict] = []
    for max_gib in MAX_EST_GIB:
        taken = {r["hash"] for r in chosen}  # the earlier pools' choices
        pool = [r for r in rows if r["hash"] not in taken
                and r["est_full_ms"] <= MAX_EST_MS and r["est_full_peak_gib"] <= max_gib]
        tiers: dict[str, list[dict]] = {}
        for r in sorted(pool, key=lambda r: r["hash"]):
            tiers.setdefault(r["data_source"], []).append(r)
        order = [tiers[k] for k in sorted(tiers)]
        while len(chosen) < count and any(order):
            for tier in order:
                if tier and len(chosen) < count:
                    chosen.append(tier.pop(0))
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--count",
        type=int,
        default=751,
        help="tasks to choose (default: the committed selection's size). The rule keeps the first choices "
        "as they were, so a larger count appends; grow it when too few chosen tasks pass the GPU time "
        "filter and are free of every card's recording",
    )
    args = p.parse_args(argv)
    import pyarrow.parquet as pq

    from autoprofiler.tasks import ops_task_id

    columns = ["data_source", "hash", "est_full_ms", "est_full_peak_gib"]
    rows = pq.read_table(TABLE, columns=columns).to_pylist()
    for index, r in enumerate(rows):
        r["id"] = ops_task_id(r["data_source"], index, TABLE)
    chosen = select(rows, args.count)
    if len(chosen) < args.count:
        print(f"error: only {len(chosen)} tasks meet the rule, --count {args.count}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    lines = ["# task id<TAB>task hash: the generated tasks of the H200 recording (bench/select_generated.py)"]
    lines += [f"{r['id']}\t{r['hash']}" for r in chosen]
    (OUT / "selection.txt").write_text("\n".join(lines) + "\n")
    (OUT / "record.yaml").write_text(CONFIG.format(filter=json.dumps([r["id"] for r in chosen])))
    tiers = {}
    for r in chosen:
        tiers[r["data_source"]] = tiers.get(r["data_source"], 0) + 1
    print(f"{len(chosen)} tasks ({tiers}) -> {OUT / 'selection.txt'}, {OUT / 'record.yaml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
