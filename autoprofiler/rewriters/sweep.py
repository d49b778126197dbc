"""Evaluate every RuleRewriter action on a set of tasks: which actions pass the evaluator, how fast.

The replay environment needs every action's outcome per task, and the rules should pick actions that
pass where they apply: this sweep measures both. Each (task, action) candidate goes through the real
sandboxed evaluator; ``tf32`` is also evaluated at a loose tolerance (``--tf32-tolerance``), since TF32
is expected to fail the fp32 default of 1e-4.

Run on the H200 (no ray, polars or openai needed)::

    python3 -m autoprofiler.rewriters.sweep datasets/suite --device cuda --jobs 4 \\
        --tasks l1/matmul_square,l1/conv2d,l1/tiny_add,l2/linear_gelu,l2/swish_chain,l3/resnet_basic_block \\
        --out bench/results

On a CPU (small task sizes; torch_compile is slow there, leave it out)::

    python -m autoprofiler.rewriters.sweep datasets/suite --device cpu --task-size small \\
        --actions keep,cuda_graph,tf32,channels_last --tasks l1/relu,l2/conv_bn_relu

Writes ``rule_actions_<device>.json`` (config + one row per evaluation) and ``.md`` (the table and a
per-action summary) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import queue
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from autoprofiler.rewriters.rule import RuleRewriter

logger = logging.getLogger(__name__)


def sweep_actions(
    tasks, config, actions=None, tf32_tolerance: float | None = 1e-2, jobs: int = 1, rewriter=None
):
    """Evaluate each action's candidate on each task; one row per evaluation, in (task, action) order.

    Parameters:
        tasks: ``Task`` objects.
        config: the ``EvalConfig`` for every evaluation (``tf32`` at ``tf32_tolerance`` is added as the
            label ``"tf32@<tol>"`` unless ``tf32_tolerance`` is None).
        actions: action names (default: all of ``RuleRewriter.actions()``).
        jobs: evaluators working at once (each its own worker pool); timing is serialized across them by
            a lock file, so builds and compiles overlap but measurements do not.
        rewriter: the ``RuleRewriter`` building the candidates (default ``RuleRewriter()``).

    Returns: ``[{"task", "action", "correct", "error_kind", "error", "ref_ms", "new_ms", "speedup",
    "wall_s"}, ...]``.
    """
    from autoprofiler.evaluation import Evaluator  # lazy: the evaluator pulls in subprocess machinery

    rewriter = rewriter or RuleRewriter()
    actions = list(actions or rewriter.actions())
    runs = [(a, config, a) for a in actions]
    if tf32_tolerance is not None and "tf32" in actions:
        loose = replace(config, atol=tf32_tolerance, rtol=tf32_tolerance)
        runs.append(("tf32", loose, f"tf32@{tf32_tolerance:g}"))
    work = [(i, task, run) for i, (task, run) in enumerate((t, r) for t in tasks for r in runs)]
    rows: list[dict | None] = [None] * len(work)
    pending: queue.Queue = queue.Queue()
    for item in work:
        pending.put(item)
    lock_dir = tempfile.mkdtemp(prefix="rule_sweep_")
    base = replace(config, timing_lock=config.timing_lock or os.path.join(lock_dir, "timing.lock"))

    def worker() -> None:
        with Evaluator(base, spares=1) as evaluator:
            while True:
                try:
                    index, task, (action, cfg, label) = pending.get_nowait()
                except queue.Empty:
                    return
                source = rewriter.source_for(task, action)
                result = evaluator.evaluate(task, source, config=replace(cfg, timing_lock=base.timing_lock))
                rows[index] = {
                    "task": task.id,
                    "action": label,
                    "correct": bool(result.correct),
                    "error_kind": result.error_kind,
                    "error": (result.error or "")[:500],
                    "ref_ms": result.ref_ms,
                    "new_ms": result.new_ms,
                    "speedup": result.speedup,
                    "wall_s": round(result.wall_s, 2),
                }
                logger.info("%s %s: %s", task.id, label, result.summary())

    threads = [threading.Thread(target=worker, name=f"sweep-{n}") for n in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [row for row in rows if row is not None]


def summarize(rows: list[dict]) -> list[dict]:
    """Per action: evaluations, correct, geomean speedup over the correct ones, and effective geomean
    (speedup if correct else 1.0, over all), in first-seen action order."""
    out = []
    for action in dict.fromkeys(r["action"] for r in rows):
        mine = [r for r in rows if r["action"] == action]
        good = [r["speedup"] for r in mine if r["correct"] and r["speedup"]]
        effective = [r["speedup"] if r["correct"] and r["speedup"] else 1.0 for r in mine]
        out.append(
            {
                "action": action,
                "evaluated": len(mine),
                "correct": sum(r["correct"] for r in mine),
                "geomean_speedup_correct": _geomean(good),
                "geomean_effective_speedup": _geomean(effective),
            }
        )
    return out


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def render_markdown(rows: list[dict], header: str) -> str:
    """The per-evaluation table and the per-action summary as Markdown."""
    lines = [f"# {header}", "", "| task | action | correct | speedup | ref ms | new ms | error |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        error = (r["error_kind"] or "") + (": " + r["error"][:100] if r["error"] else "")
        lines.append(
            f"| {r['task']} | {r['action']} | {'yes' if r['correct'] else 'no'} | {_fmt(r['speedup'])} | "
            f"{_fmt(r['ref_ms'])} | {_fmt(r['new_ms'])} | {error.replace('|', '/').replace(chr(10), ' ')} |"
        )
    lines += ["", "| action | evaluated | correct | geomean speedup (correct) | geomean effective speedup |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for s in summarize(rows):
        lines.append(
            f"| {s['action']} | {s['evaluated']} | {s['correct']} | {_fmt(s['geomean_speedup_correct'])} | "
            f"{_fmt(s['geomean_effective_speedup'])} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _select(tasks, wanted: str | None):
    if not wanted:
        return list(tasks)
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    chosen = []
    for name in names:
        match = [t for t in tasks if t.id == name or t.id.endswith("/" + name)]
        if not match:
            raise SystemExit(f"--tasks: no task matches {name!r}; known: {', '.join(t.id for t in tasks)}")
        chosen.extend(match)
    return chosen


def main(argv: list[str] | None = None) -> int:
    from autoprofiler.evaluation import EvalConfig
    from autoprofiler.tasks import load_tasks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="tasks: a folder, a .py task, a KernelBench checkout or a table")
    parser.add_argument("--tasks", help="comma-separated task ids or id suffixes (default: all)")
    parser.add_argument("--actions", help=f"comma-separated, default all of {RuleRewriter.actions()}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--task-size", default="full", choices=("full", "small"))
    parser.add_argument("--timing-trials", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tf32-tolerance", type=float, default=1e-2)
    parser.add_argument("--compile-mode", default="default")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    report = load_tasks(args.spec)
    for error in report.errors:
        print(f"skipping: {error}", file=sys.stderr)
    tasks = _select(report.tasks, args.tasks)
    actions = args.actions.split(",") if args.actions else None
    config = EvalConfig(
        device=args.device, task_size=args.task_size, timing_trials=args.timing_trials, warmup=args.warmup
    )
    start = time.time()
    rows = sweep_actions(
        tasks, config, actions, args.tf32_tolerance, args.jobs, RuleRewriter(compile_mode=args.compile_mode)
    )
    device = args.device
    try:
        import torch

        if device.startswith("cuda") and torch.cuda.is_available():
            device = torch.cuda.get_device_name(0)
        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - torch is a hard dependency
        torch_version = "?"
    stem = "rule_actions_" + device.replace(" ", "_").lower()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": device,
        "torch": torch_version,
        "argv": sys.argv[1:] if argv is None else argv,
        "config": config.to_dict(),
        "seconds": round(time.time() - start, 1),
    }
    (out / f"{stem}.json").write_text(
        json.dumps({**meta, "summary": summarize(rows), "rows": rows}, indent=1)
    )
    header = (
        f"RuleRewriter actions on {device} (torch {torch_version}, {len(tasks)} tasks, {meta['seconds']} s)"
    )
    (out / f"{stem}.md").write_text(render_markdown(rows, header))
    print(render_markdown(rows, header))
    print(f"wrote {out / stem}.json and {out / stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
