"""What profiling costs on the H200: replay passes and seconds per task, per metric set and per mode.

Run on the GPU box (ncu on PATH, counters permitted); about 4-5 minutes with the defaults:
    python bench/profile_cost.py --tasks 6 --size full
Measures, over N suite tasks:
  1. the root group, batch (one process, one NVTX range per task) vs one process per task;
  2. each metric group alone (on the first --group-tasks tasks): its replay passes -> group_costs.json;
  3. each fixed configuration (algorithm, memory, latency, compute), batch;
  4. ``--set full``, batch.
Writes bench/results/profile_cost_h200.md and .json and autoprofiler/profiling/group_costs.json
(passes per group: the most any task's kernels needed). A step that would start after --budget-s
seconds is skipped and listed as skipped.

To finish a table over several GPU calls, run only the missing steps and merge with the earlier result:
    python bench/profile_cost.py --tasks 4 --only tensor_cores,instruction_mix,flops,configs,full \
        --merge bench/results/profile_cost_h200.json
(rows and group passes of the earlier file are kept for the steps not run now).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.profiling import CONFIGURATIONS, GROUPS, Profiler  # noqa: E402
from autoprofiler.profiling.groups import COSTS_PATH, ncu_request_metrics  # noqa: E402
from autoprofiler.tasks import load_task_file  # noqa: E402

# A spread of regimes: memory-bound elementwise, reduction, fp32 GEMM, conv, fused chain, small model.
DEFAULT_TASKS = [
    "l1/relu",
    "l1/matmul_square",
    "l1/softmax_rows",
    "l1/conv2d",
    "l2/linear_gelu",
    "l3/mlp_block",
    "l1/matmul_rect_bf16",
    "l1/layernorm",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=6, help="how many of the default suite tasks (default 6)")
    p.add_argument(
        "--task-ids", default=None, help="comma-separated suite ids instead, e.g. l1/relu,l2/linear_gelu"
    )
    p.add_argument("--group-tasks", type=int, default=2, help="tasks used for the one-group-at-a-time step")
    p.add_argument("--size", choices=("full", "small"), default="full")
    p.add_argument("--budget-s", type=float, default=330.0, help="skip steps that would start after this")
    p.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "profile_cost_h200"), help="output path stem"
    )
    p.add_argument("--costs", default=str(COSTS_PATH), help="where to write group_costs.json ('' to skip)")
    p.add_argument("--ncu", default="ncu")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated steps to run (default: all): root, per-task, a group name, groups, "
        "config:<name>, configs, full",
    )
    p.add_argument("--merge", default=None, help="an earlier profile_cost .json whose other rows are kept")
    return p.parse_args(argv)


def wanted(only: set[str], name: str, mode: str) -> bool:
    """Whether ``--only`` asks for the step ``name`` (``mode``); an empty set asks for all."""
    if not only:
        return True
    if name == "root":
        return ("per-task" if mode == "per-task" else "root") in only
    if name.startswith("config:"):
        return name in only or "configs" in only
    if name == "--set full":
        return "full" in only
    return name in only or "groups" in only


def summarize(name: str, mode: str, measurement: dict, processes: int) -> dict:
    tasks = measurement["tasks"]
    seconds = measurement["seconds"]
    return {
        "name": name,
        "mode": mode,
        "processes": processes,
        "tasks": len(tasks),
        "kernels": sum(t["kernels"] for t in tasks.values()),
        "passes_max": max((t["passes"] for t in tasks.values()), default=0),
        "passes_per_task": {t["id"]: t["passes"] for t in tasks.values()},
        "seconds": round(seconds, 2),
        "seconds_per_task": round(seconds / max(1, len(tasks)), 2),
        "all_ok": all(t["ok"] for t in tasks.values()),
    }


def merge(measurements: list[dict]) -> dict:
    """Several one-task measurements as one (seconds add up)."""
    return {
        "seconds": sum(m["seconds"] for m in measurements),
        "tasks": {k: v for m in measurements for k, v in m["tasks"].items()},
    }


def markdown(rows: list[dict], meta: dict, skipped: list[str], costs: dict) -> str:
    lines = [
        "# Profiling cost on the H200",
        "",
        f"`{meta['command']}` on {meta['device']} (driver {meta['driver']}, {meta['tool']}), "
        f"{meta['date']}; tasks ({meta['size']}): {', '.join(meta['tasks'])}.",
        *([f"Rows not measured by that command come from {meta['merged']}."] if meta.get("merged") else []),
        "Passes: the most replay passes any kernel of a task needed (`profiler__replayer_passes`). "
        "Seconds: wall time of the ncu process(es), start-up, replay and report export included.",
        "",
        "| measurement | mode | processes | tasks | kernels | passes (max) | seconds | seconds/task |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ok = "" if r["all_ok"] else " (some tasks failed)"
        lines.append(
            f"| {r['name']}{ok} | {r['mode']} | {r['processes']} | {r['tasks']} | {r['kernels']} "
            f"| {r['passes_max']} | {r['seconds']:.1f} | {r['seconds_per_task']:.2f} |"
        )
    batch = next((r for r in rows if r["name"] == "root" and r["mode"] == "batch"), None)
    single = next((r for r in rows if r["name"] == "root" and r["mode"] == "per-task"), None)
    if batch and single and batch["seconds"] > 0:
        gain = single["seconds"] / batch["seconds"]
        lines += ["", f"Batch gain (root group): {single['seconds']:.1f} s with one process per task vs "
                  f"{batch['seconds']:.1f} s in one process: {gain:.1f}x."]  # fmt: skip
    if costs:
        lines += ["", "Replay passes per group (written to `autoprofiler/profiling/group_costs.json`): "
                  + ", ".join(f"{g} {p}" for g, p in costs.items()) + "."]  # fmt: skip
    if skipped:
        lines += ["", "Skipped (over the time budget): " + ", ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    ids = args.task_ids.split(",") if args.task_ids else DEFAULT_TASKS[: args.tasks]
    tasks = [load_task_file(ROOT / "datasets" / "suite" / f"{i}.py", id=f"suite/{i}") for i in ids]
    profiler = Profiler(source="ncu", device="cuda", task_size=args.size, timeout_s=600, ncu_path=args.ncu)
    env = profiler.environment
    print(
        f"profiling cost on {env.device} / driver {env.driver} / {env.tool}; {len(tasks)} tasks ({args.size})"
    )
    start = time.monotonic()
    rows: list[dict] = []
    skipped: list[str] = []
    costs: dict[str, int] = {}

    only = {x.strip() for x in args.only.split(",") if x.strip()}

    def step(name: str, mode: str, run) -> dict | None:
        if not wanted(only, name, mode):
            return None
        if time.monotonic() - start > args.budget_s:
            skipped.append(f"{name} ({mode})")
            print(f"  skip {name} ({mode}): over the {args.budget_s:.0f} s budget")
            return None
        measurement, processes = run()
        row = summarize(name, mode, measurement, processes)
        rows.append(row)
        elapsed = time.monotonic() - start
        per_task = row["seconds_per_task"]
        print(f"  {name:<16} {mode:<9} passes {row['passes_max']:>3}  {row['seconds']:7.1f} s  "
              f"({per_task:.2f} s/task, {row['kernels']} kernels, at {elapsed:.0f} s)")  # fmt: skip
        return row

    root_metrics = ncu_request_metrics(["root"])
    root = step("root", "batch", lambda: (profiler.measure(tasks, root_metrics), 1))
    if root is not None and root["all_ok"]:
        costs["root"] = root["passes_max"]
    step(
        "root", "per-task", lambda: (merge([profiler.measure([t], root_metrics) for t in tasks]), len(tasks))
    )
    group_tasks = tasks[: args.group_tasks]
    for name, group in GROUPS.items():
        if group.source != "ncu" or name == "root":  # root: measured above on every task
            continue
        row = step(name, "batch", lambda g=name: (profiler.measure(group_tasks, ncu_request_metrics([g])), 1))
        if row is not None and row["all_ok"]:
            costs[name] = row["passes_max"]
    for name, groups in CONFIGURATIONS.items():
        if name.startswith("torch_"):
            continue
        step(
            f"config:{name}", "batch", lambda gs=groups: (profiler.measure(tasks, ncu_request_metrics(gs)), 1)
        )
    step("--set full", "batch", lambda: (profiler.measure(tasks, None, ("--set", "full")), 1))

    meta = {
        "command": "python bench/profile_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": env.device,
        "driver": env.driver,
        "tool": env.tool,
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "size": args.size,
        "tasks": [t.id for t in tasks],
        "group_tasks": [t.id for t in group_tasks],
        "total_seconds": round(time.monotonic() - start, 1),
    }
    if args.merge:  # keep the earlier run's rows for the steps not measured now, and its group passes
        earlier = json.loads(Path(args.merge).read_text())
        done = {(r["name"], r["mode"]) for r in rows}
        then = earlier["meta"]["date"]
        kept = [dict(r, run=then) for r in earlier["rows"] if (r["name"], r["mode"]) not in done]
        rows = kept + [dict(r, run=meta["date"]) for r in rows]
        costs = {**earlier.get("group_passes", {}), **costs}
        skipped = [s for s in skipped if s.split(" (")[0] not in {r["name"] for r in rows}]
        meta["merged"] = f"`{earlier['meta']['command']}` ({then}; {', '.join(earlier['meta']['tasks'])})"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "rows": rows, "skipped": skipped, "group_passes": costs}, indent=1)
    )
    out.with_suffix(".md").write_text(markdown(rows, meta, skipped, costs))
    if args.costs and costs:
        Path(args.costs).write_text(json.dumps({
            "device": env.device, "driver": env.driver, "tool": env.tool, "measured": meta["date"],
            "tasks": meta["group_tasks"], "size": args.size, "passes": costs,
        }, indent=1) + "\n")  # fmt: skip
        print(f"wrote {args.costs}")
    print(f"wrote {out.with_suffix('.md')} and .json in {meta['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
