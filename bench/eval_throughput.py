"""Evaluator throughput and the identity-speedup noise floor over the task suite.

Every suite task is evaluated with an identity candidate (``ModelNew = Model``): its measured speedup
should be 1.0, so the spread of these speedups is the noise floor every later accept/reject decision
rests on. Prints a table per task and totals (evaluations per minute, median identity speedup, spread),
and writes Markdown + JSON.

Run:
    python bench/eval_throughput.py --device cpu --size small --trials 100        # this laptop-class box
    python bench/eval_throughput.py --device cuda --size full --trials 100        # the H200
    python bench/eval_throughput.py ... --trace /tmp/trace.jsonl   # + phase times and every timed call
Outputs: bench/results/eval_throughput_<device>.md and .json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.evaluation import EvalConfig, Evaluator, TaskError, identity_candidate  # noqa: E402
from autoprofiler.evaluation.results import OUTPUT_TRANSPORTS  # noqa: E402
from autoprofiler.tasks import load_task_folder  # noqa: E402


def percentile(xs: list[float], p: float) -> float:
    """Linear-interpolation percentile, ``p`` in [0, 100]."""
    xs = sorted(xs)
    pos = (len(xs) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument(
        "--size", choices=("full", "small"), default=None, help="default: small on cpu, full on cuda"
    )
    p.add_argument("--trials", type=int, default=100, help="timing trials per evaluation")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1, help="evaluations per task (spread across repeats)")
    p.add_argument("--spares", type=int, default=2, help="warm workers kept ready")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the workers (CPU timing)")
    p.add_argument("--suite", default=str(ROOT / "datasets" / "suite"))
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    p.add_argument("--only", default=None, help="comma-separated task names: only tasks whose id ends so")
    p.add_argument("--l2-flush-mb", type=int, default=256, help="EvalConfig.l2_flush_mb (CUDA; 0: none)")
    p.add_argument(
        "--output-transport",
        default="auto",
        choices=OUTPUT_TRANSPORTS,
        help="how the candidate's outputs reach the reference process (EvalConfig.output_transport)",
    )
    p.add_argument(
        "--timing-cores", type=int, default=0, help="EvalConfig.timing_cores (0: 1 on CUDA, threads on CPU)"
    )
    p.add_argument(
        "--trace",
        default=None,
        help="JSONL path: per evaluation its phase times, memory plan, every timed call (EvalConfig.trace)",
    )
    p.add_argument(
        "--out", default=None, help="Markdown path (default bench/results/eval_throughput_<device>.md)"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    size = args.size or ("small" if args.device == "cpu" else "full")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by the workers' torch at import
    out = Path(args.out or ROOT / "bench" / "results" / f"eval_throughput_{args.device.split(':')[0]}.md")
    report = load_task_folder(args.suite)
    for err in report.errors:
        print(f"skipping a task that does not load: {err}", file=sys.stderr)
    tasks = list(report)[: args.limit] if args.limit else list(report)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        tasks = [t for t in tasks if any(t.id == n or t.id.endswith("/" + n) for n in names)]
        if len(tasks) != len(names):
            print(f"error: --only {args.only}: {len(tasks)} of {len(names)} names found", file=sys.stderr)
            return 2
    config = EvalConfig(
        device=args.device,
        task_size=size,
        timing_trials=args.trials,
        warmup=args.warmup,
        trace=bool(args.trace),
        output_transport=args.output_transport,
        timing_cores=args.timing_cores,
        l2_flush_mb=args.l2_flush_mb,
    )
    trace = open(args.trace, "w") if args.trace else None  # noqa: SIM115 - closed at the end
    print(
        f"{len(tasks)} tasks x {args.repeats} on {args.device} ({size}), {args.trials} timing trials",
        flush=True,
    )

    rows, failures = [], []
    with Evaluator(config, spares=args.spares) as ev:
        ev.warm_up()
        t0 = time.monotonic()
        for task in tasks:
            results = []
            for _ in range(args.repeats):
                try:
                    results.append(ev.evaluate(task, identity_candidate(task.source)))
                    if trace is not None:
                        trace.write(json.dumps(trace_line(task.id, results[-1])) + "\n")
                except TaskError as exc:
                    failures.append(f"{task.id}: {exc}")
                    break
            if not results:
                continue
            ok = [r for r in results if r.correct]
            speedups = [r.speedup for r in ok if r.speedup is not None]
            first = results[0]
            row = {
                "task": task.id,
                "level": task.level,
                "correct": len(ok),
                "runs": len(results),
                "ref_ms": statistics.median(r.ref_ms for r in ok) if ok else None,
                "new_ms": statistics.median(r.new_ms for r in ok) if ok else None,
                "ref_iqr_ms": statistics.median(r.ref_iqr_ms for r in ok) if ok else None,
                "new_iqr_ms": statistics.median(r.new_iqr_ms for r in ok) if ok else None,
                "speedup": statistics.median(speedups) if speedups else None,
                "speedup_min": min(speedups) if speedups else None,
                "speedup_max": max(speedups) if speedups else None,
                "wall_s": statistics.mean(r.wall_s for r in results),
                "error": "" if ok else f"{first.error_kind}: {first.error[:120]}",
            }
            rows.append(row)
            shown = f"{row['speedup']:.3f}" if row["speedup"] is not None else row["error"]
            print(f"  {task.id:45s} {shown}  ({row['wall_s']:.2f} s)", flush=True)
        elapsed = time.monotonic() - t0
        evaluations = ev.evaluations
    if trace is not None:
        trace.close()

    all_speedups = [r["speedup"] for r in rows if r["speedup"] is not None]
    totals = {
        "tasks": len(rows),
        "evaluations": evaluations,
        "elapsed_s": round(elapsed, 1),
        "evaluations_per_minute": round(evaluations / elapsed * 60.0, 1) if elapsed > 0 else None,
        "correct_tasks": sum(1 for r in rows if r["correct"] == r["runs"]),
        "median_speedup": statistics.median(all_speedups) if all_speedups else None,
        "min_speedup": min(all_speedups) if all_speedups else None,
        "max_speedup": max(all_speedups) if all_speedups else None,
        "p5_speedup": percentile(all_speedups, 5) if all_speedups else None,
        "p95_speedup": percentile(all_speedups, 95) if all_speedups else None,
        "within_3pct": sum(1 for s in all_speedups if abs(s - 1.0) <= 0.03),
    }
    meta = {
        "command": "python bench/eval_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": config.to_dict(),
        "spares": args.spares,
        "repeats": args.repeats,
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average at the end {os.getloadavg()[0]:.1f}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    try:
        import torch

        meta["torch"] = torch.__version__
        if args.device.startswith("cuda") and torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass

    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "totals": totals, "rows": rows, "failures": failures}, indent=2) + "\n"
    )
    out.write_text(render_markdown(meta, totals, rows, failures))
    print(render_totals(totals))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def trace_line(task_id: str, result) -> dict:
    """One evaluation for ``--trace``: where its wall time went and every timed call."""
    keys = (
        "phase_s",
        "candidate_trials_s",
        "candidate_pack_s",
        "unpack_outputs_s",
        "compare_s",
        "memory_plan",
        "block_size",
        "timing_blocks",
        "witness",
        "spread",
        "timing_cpus",
        "timing_minor_faults",
        "clean_ref_ms",
        "trace",
    )
    return {
        "task": task_id,
        "speedup": result.speedup,
        "ref_ms": result.ref_ms,
        "new_ms": result.new_ms,
        "wall_s": result.wall_s,
        "error": result.error[:300],
        **{k: result.details.get(k) for k in keys},
    }


def _f(x, fmt=".4g") -> str:
    return "-" if x is None else format(x, fmt)


def render_totals(t: dict) -> str:
    spread = ", ".join(f"{k} {_f(t[f'{k}_speedup'], '.3f')}" for k in ("min", "p5", "p95", "max"))
    n = t["tasks"]
    return (
        f"{t['evaluations']} evaluations in {t['elapsed_s']} s = {t['evaluations_per_minute']} per minute; "
        f"identity speedup median {_f(t['median_speedup'], '.4f')}, {spread}; "
        f"{t['within_3pct']}/{n} tasks within 1.00 +/- 0.03; {t['correct_tasks']}/{n} correct"
    )


def render_markdown(meta: dict, totals: dict, rows: list[dict], failures: list[str]) -> str:
    lines = [
        f"# Evaluator throughput and identity noise floor ({meta['config']['device']})",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}{', ' + meta['gpu'] if 'gpu' in meta else ''}; "
        f"torch {meta.get('torch')}; {meta['date_utc']} UTC  ",
        f"Config: task_size={meta['config']['task_size']}, timing_trials={meta['config']['timing_trials']}, "
        f"warmup={meta['config']['warmup']}, spares={meta['spares']}, repeats={meta['repeats']}",
        "",
        "## Totals",
        "",
        render_totals(totals),
        "",
        "## Per task (identity candidate: speedup should be 1.0)",
        "",
        "| task | level | ref_ms | new_ms | speedup | min | max | ref iqr | new iqr | wall s | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['level']} | {_f(r['ref_ms'])} | {_f(r['new_ms'])} | "
            f"{_f(r['speedup'], '.3f')} | {_f(r['speedup_min'], '.3f')} | {_f(r['speedup_max'], '.3f')} | "
            f"{_f(r['ref_iqr_ms'], '.2g')} | "
            f"{_f(r['new_iqr_ms'], '.2g')} | {r['wall_s']:.2f} | {r['error']} |"
        )
    if failures:
        lines += ["", "## Tasks that failed (TaskError)", ""] + [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
