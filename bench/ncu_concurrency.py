"""Can several ncu processes profile on one GPU at once, and do their counters stay clean?

The recording spends minutes per chunk of tasks, one group's profiled process after another. This
bench profiles one chunk with one group alone, then ``--copies`` identical runs of the same chunk and
group at the same time (each its own ncu process), and prints a table: wall time alone and together,
and for every task the largest relative difference of any task-level metric between the alone run
and each concurrent run. If ncu serializes the replay passes across processes, the metrics agree with
the alone run's (up to run-to-run noise: the table also compares the alone run with the rows the
recording holds for the same tasks) and the concurrent wall time shows how much of a run overlaps
(the program's start, inputs, warm-up, the export); if it does not, kernels of the other process run
during a measured pass and throughput metrics move. ``--copies 0`` runs only the alone run, so the
table says how far today's profiles of the chunk are from the recorded ones (e.g. built on the GPU
against rows built on the host).

    python3 bench/ncu_concurrency.py --tasks datasets/ops_gen/tasks.parquet \\
        --ids-from datasets/recorded/h200/profiles --group root --copies 2 --out /tmp/ncu_concurrency.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def recorded(folder: Path, group: str, limit: int) -> dict[str, dict]:
    """The first ``limit`` tasks a recording holds ``group`` for: task id -> its recorded metrics."""
    import pyarrow.parquet as pq

    out: dict[str, dict] = {}
    for part in sorted(folder.rglob("*.parquet")):
        for row in pq.read_table(part, columns=["task_id", "group", "profile_json"]).to_pylist():
            if row["group"] == group and row["task_id"] not in out and len(out) < limit:
                out[row["task_id"]] = json.loads(row["profile_json"])["metrics"]
    return out


def profile_once(tasks, group: str, task_size: str) -> tuple[float, dict]:
    """One profiled process for ``tasks`` and ``group``: (wall seconds, task hash -> task-level metrics)."""
    from autoprofiler.profiling import Profiler

    profiler = Profiler(source="ncu", device="cuda", cache=None, task_size=task_size)
    t0 = time.monotonic()
    profiles = profiler.collect_many(tasks, [group])
    return time.monotonic() - t0, {p.task_hash: dict(p.metrics) for p in profiles}


def largest_difference(a: dict, b: dict) -> tuple[float, str]:
    """The largest relative difference of a metric both hold, and its name."""
    worst, name = 0.0, ""
    for key, x in a.items():
        y = b.get(key)
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
            continue
        scale = max(abs(x), abs(y))
        diff = abs(x - y) / scale if scale > 0 else 0.0
        if diff > worst:
            worst, name = diff, key
    return worst, name


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks", required=True, help="a task table or folder (autoprofiler.tasks.load_tasks)"
    )
    parser.add_argument(
        "--ids-from", required=True, help="a recording's profiles folder: its first tasks with --group"
    )
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--group", default="root")
    parser.add_argument(
        "--copies", type=int, default=2, help="0: only the alone run against the recorded rows"
    )
    parser.add_argument("--task-size", default="full")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from autoprofiler.tasks import load_tasks

    before = recorded(Path(args.ids_from), args.group, args.count)
    ids = list(before)
    by_id = {t.id: t for t in load_tasks(args.tasks).tasks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        print(f"error: tasks not in {args.tasks}: {missing[:5]}", file=sys.stderr)
        return 2
    tasks = [by_id[i] for i in ids]
    alone_s, alone = profile_once(tasks, args.group, args.task_size)
    t0 = time.monotonic()
    runs = []
    if args.copies:
        with ThreadPoolExecutor(args.copies) as pool:
            runs = list(
                pool.map(lambda _: profile_once(tasks, args.group, args.task_size), range(args.copies))
            )
    together_s = time.monotonic() - t0
    rows = []
    for task in tasks:
        diffs = [largest_difference(alone[task.hash], metrics[task.hash]) for _, metrics in runs] or [
            (0.0, "")
        ]
        noise = largest_difference(before[task.id], alone[task.hash])
        rows.append(
            {
                "task": task.id,
                "worst": max(diffs)[0],
                "metric": max(diffs)[1],
                "recorded_vs_alone": noise[0],
                "recorded_vs_alone_metric": noise[1],
            }
        )
    out = {
        "group": args.group,
        "tasks": len(tasks),
        "copies": args.copies,
        "alone_s": round(alone_s, 1),
        "together_s": round(together_s, 1),
        "each_s": [round(s, 1) for s, _ in runs],
        "per_task": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"| run | wall s |\n| --- | --- |\n| alone | {alone_s:.1f} |")
    print(f"| {args.copies} at once | {together_s:.1f} (each {', '.join(f'{s:.1f}' for s, _ in runs)}) |")
    print("\n| task | largest relative difference: alone vs at once | metric | recorded vs alone | metric |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['task']} | {r['worst']:.3f} | {r['metric']} | {r['recorded_vs_alone']:.3f} "
            f"| {r['recorded_vs_alone_metric']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
