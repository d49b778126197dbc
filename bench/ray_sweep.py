"""Cells per minute through the runtime: in this process, or fanned out to Ray workers; replay and live.

Replay (cheap cells: the driver's own overhead shows), over a recording's fully recorded tasks and
every configuration of up to ``--max-groups`` groups:

    python bench/ray_sweep.py replay --recording datasets/h200_suite --workers 0,1,2 \
        --out bench/results/ray_sweep_replay

Live (every rule action evaluated in the sandbox; CPU at small sizes, or one GpuWorker on a GPU):

    python bench/ray_sweep.py live --device cpu --task-size small --workers 0,1,2 --concurrency 1 \
        --filter relu,softmax_rows,layernorm,matmul_square --actions keep,channels_last,cuda_graph,tf32 \
        --out bench/results/ray_sweep_live_cpu
    python3 bench/ray_sweep.py live --device cuda --task-size full --workers 1 --concurrency 6 --out $OUT/gpu

``--workers 0`` is the in-process ``LocalDriver`` (no Ray): ``run_cell`` on each cell, one after
another; N > 0 starts N ``GpuWorker`` (or ``ReplayWorker``) actors on a local Ray. For each setting the
table gives cells, wall seconds, cells per minute, and the time per cell beyond the in-process run.
With ``--gpu-sample`` the GPU's utilization is sampled (``nvidia-smi``, every 200 ms) during each
live run: the busy share is the fraction of samples above 0%. Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # multigpu's GpuSampler, beside this file


def replay_cells(recording: Path, max_groups: int, source: str):
    from autoprofiler.environments import ReplayEnvironment
    from autoprofiler.rewriters import RuleRewriter
    from autoprofiler.tasks import load_tasks

    env = ReplayEnvironment(recording, RuleRewriter(), source)
    tasks, _ = env.fully_recorded(load_tasks(ROOT / "datasets" / "suite").tasks)
    groups = sorted({g for t in tasks for g in env.profiler.recorded_groups(t)})
    configs = [c for k in range(max_groups + 1) for c in itertools.combinations(groups, k)]
    return [env.cell(t, c) for t in tasks for c in configs]


def time_replay(recording: Path, cells, workers: int, source: str) -> dict:
    from autoprofiler.cells import RewardRow
    from autoprofiler.environments import ReplayEnvironment
    from autoprofiler.rewriters import RuleRewriter

    runner = None
    if workers:
        from autoprofiler.runtime.ray_driver import RayDriver

        runner = RayDriver.start_replay(str(recording), source, num_workers=workers, progress=None)
    env = ReplayEnvironment(recording, RuleRewriter(), source, runner=runner)
    t0 = time.perf_counter()
    results = env.try_outcomes(cells)
    seconds = time.perf_counter() - t0
    env.close()
    return {"cells": len(cells), "seconds": seconds, "rows": sum(isinstance(r, RewardRow) for r in results)}


def gpu_use(samples: dict[str, list[float]]) -> dict:
    """``multigpu.GpuSampler``'s samples of every GPU, pooled: count, busy share and mean use (%)."""
    pooled = [u for util in samples.values() for u in util]
    if not pooled:
        return {"gpu_samples": 0} if samples else {}
    return {
        "gpu_samples": len(pooled),
        "gpu_busy_share": sum(u > 0 for u in pooled) / len(pooled),
        "gpu_mean_util": sum(pooled) / len(pooled),
    }


def live_cells(args):
    from autoprofiler.environments import action_cells
    from autoprofiler.rewriters import RuleRewriter
    from autoprofiler.tasks import load_tasks

    tasks = load_tasks(ROOT / args.tasks).tasks
    if args.filter:
        wanted = set(args.filter.split(","))
        tasks = [t for t in tasks if t.id.split("/")[-1] in wanted]
    rule = RuleRewriter()
    actions = set(args.actions.split(",")) if args.actions else set(rule.actions())
    return [c for c in action_cells(tasks, rule) if c.action in actions]


def time_live(args, cells, workers: int, out_dir: Path) -> dict:
    from autoprofiler.cells import RewardRow, WorkItem
    from autoprofiler.runtime import CellWorker, LocalDriver, WorkerSpec

    spec = WorkerSpec(
        device=args.device,
        task_size=args.task_size,
        source="torch" if args.device == "cpu" else "ncu",
        eval={
            "timing_trials": args.timing_trials,
            "warmup": args.warmup,
            "correctness_trials": args.correctness,
        },
        concurrency=args.concurrency,
    )
    t_start = time.perf_counter()
    if workers:
        from autoprofiler.runtime.ray_driver import RayDriver

        runner = RayDriver.start(spec, num_workers=workers, progress=None)
        runner.info()  # the actors are up (their evaluator pools warm) before the clock starts
    else:
        runner = LocalDriver(CellWorker(spec))
    startup = time.perf_counter() - t_start
    from multigpu import GpuSampler

    sampler = GpuSampler(args.gpu_sample)
    t0 = time.perf_counter()
    results = runner.run_cells([WorkItem(c) for c in cells])
    seconds = time.perf_counter() - t0
    gpu = gpu_use(sampler.stop())
    runner.close()
    rows = [r for r in results if isinstance(r, RewardRow)]
    path = out_dir / f"rows_w{workers}_c{args.concurrency}.jsonl"
    path.write_text("".join(json.dumps(r.to_record(), default=str) + "\n" for r in rows))
    return {
        "cells": len(cells),
        "seconds": seconds,
        "startup_seconds": startup,
        "rows": len(rows),
        "correct": sum(r.correct for r in rows),
        **gpu,
    }


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["workers"] == 0), None)
    head = [
        "workers",
        "concurrency",
        "cells",
        "seconds",
        "cells/min",
        "vs in-process",
        "extra ms/cell",
        "GPU busy",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        rate = 60 * r["cells"] / r["seconds"]
        ratio = f"{base['seconds'] / r['seconds']:.2f}x" if base else "-"
        extra = f"{1000 * (r['seconds'] - base['seconds']) / r['cells']:+.2f}" if base else "-"
        busy = f"{r['gpu_busy_share']:.0%} (mean {r['gpu_mean_util']:.0f}%)" if "gpu_busy_share" in r else "-"
        who = r["workers"] or "in-process"
        lines.append(
            f"| {who} | {r.get('concurrency', '-')} | {r['cells']} | {r['seconds']:.1f} | "
            f"{rate:.0f} | {ratio} | {extra} | {busy} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("replay", "live"))
    p.add_argument("--workers", default="0,1,2", help="comma-separated; 0 = in process, no Ray")
    p.add_argument("--out", required=True, help="output path stem (.json and .md)")
    p.add_argument("--recording", default="datasets/h200_suite")
    p.add_argument("--source", default="ncu")
    p.add_argument("--max-groups", type=int, default=3)
    p.add_argument("--tasks", default="datasets/suite")
    p.add_argument("--filter", default="")
    p.add_argument("--actions", default="")
    p.add_argument("--device", default="cpu")
    p.add_argument("--task-size", default="small")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--timing-trials", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--correctness", type=int, default=2)
    p.add_argument("--gpu-sample", action="store_true")
    p.add_argument("--cpus", type=int, default=None, help="CPUs for the local Ray (default: all)")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    workers = [int(w) for w in args.workers.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if any(workers):
        from autoprofiler.runtime.ray_driver import init_ray

        init_ray(num_cpus=args.cpus)
    results = []
    if args.mode == "replay":
        recording = ROOT / args.recording
        cells = replay_cells(recording, args.max_groups, args.source)
        for w in workers:
            results.append({"workers": w, **time_replay(recording, cells, w, args.source)})
            print(json.dumps(results[-1]), flush=True)
    else:
        cells = live_cells(args)
        rows_dir = out.parent / (out.name + "_rows")
        rows_dir.mkdir(exist_ok=True)
        for w in workers:
            results.append(
                {"workers": w, "concurrency": args.concurrency, **time_live(args, cells, w, rows_dir)}
            )
            print(json.dumps(results[-1]), flush=True)
    load = os.getloadavg()
    meta = {"argv": sys.argv[1:] if argv is None else argv, "cpus": os.cpu_count(), "loadavg": load}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    header = (
        f"# bench/ray_sweep.py {' '.join(meta['argv'])}\n\n{os.cpu_count()} CPUs, load average {load}.\n\n"
    )
    out.with_suffix(".md").write_text(header + table(results))
    print(header + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
