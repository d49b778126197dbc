"""Validate and time the suite: load every task (no execution), then build each Model and run forward.

Run (CPU, small shapes; prints a Markdown table of per-task forward times):
    AUTOPROFILER_TASK_SIZE=small python datasets/suite/_check_suite.py --device cpu
Run on a GPU at full size (median of 20 CUDA-event-timed forwards after warm-up):
    python datasets/suite/_check_suite.py --size full --device cuda --json bench/results/suite_full_h200.json

Each task is imported from its source into a fresh module after AUTOPROFILER_TASK_SIZE is set (tasks
read it at import). Exits 1 if any task fails to load, to run, or gives a non-finite or
non-deterministic output.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parent


def import_task(task, name: str):
    """Execute a task's source in a fresh module (the caller sets AUTOPROFILER_TASK_SIZE first)."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(task.source, task.origin or task.id, "exec"), module.__dict__)
    return module


def _to(values, device):
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


REGIMES = ("compute-bound", "memory-bound", "latency-bound")


def regime(task) -> str:
    """The expected regime from the tags, e.g. ``"memory-bound"`` or ``"compute-bound, algorithmic"``."""
    names = [tag for tag in task.tags if tag in REGIMES] + [tag for tag in task.tags if tag == "algorithmic"]
    return ", ".join(names)


def run_task(task, device: str = "cpu", seed: int = 0, repeats: int = 5, warmup: int = 1):
    """Build Model (seeded) and run forward twice from the same seed, then time ``repeats`` forwards.

    On CUDA the model and inputs are created on the device (``torch.device`` context) and timed with
    CUDA events after ``warmup`` forwards.
    Returns (outputs, median forward seconds, best forward seconds, deterministic, finite).
    """
    import torch

    module = import_task(task, "suite_task_" + task.hash)

    def build_and_run():
        with torch.device(device):
            torch.manual_seed(seed)
            model = module.Model(*module.get_init_inputs())
            torch.manual_seed(seed)
            inputs = module.get_inputs()
        with torch.no_grad():
            return model, inputs, model(*inputs)

    model, inputs, first = build_and_run()
    outputs_a = first if isinstance(first, (tuple, list)) else (first,)
    finite = all(torch.isfinite(o.float()).all().item() for o in outputs_a)
    second = build_and_run()[2]
    outputs_b = second if isinstance(second, (tuple, list)) else (second,)
    deterministic = all(torch.equal(a, b) for a, b in zip(outputs_a, outputs_b, strict=True))
    del second, outputs_b
    times = []
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(*inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                model(*inputs)
                times.append(time.perf_counter() - t0)
    return outputs_a, statistics.median(times), min(times), deterministic, finite


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", choices=("small", "full"), default=os.environ.get("AUTOPROFILER_TASK_SIZE", "small")
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default 1: with 2 OpenMP threads on a busy 2-CPU machine, "
        "forwards stall in ~8 ms steps); 0 keeps torch's default",
    )
    parser.add_argument("--only", default="", help="substring filter on task ids")
    parser.add_argument("--json", default="", help="write per-task results here")
    args = parser.parse_args(argv)
    os.environ["AUTOPROFILER_TASK_SIZE"] = args.size
    sys.path.insert(0, str(SUITE.parents[1]))
    import torch

    from autoprofiler.tasks import load_task_folder

    if args.threads > 0 and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)

    report = load_task_folder(SUITE)
    for error in report.errors:
        print(f"LOAD ERROR {error}")
    repeats = args.repeats
    if args.device.startswith("cuda"):
        repeats = max(repeats, 20)
    rows, failures = [], len(report.errors)
    total_start = time.perf_counter()
    print(
        f"| task | tags | expected regime | output ({args.size}) "
        f"| median ms ({args.device}, {args.size}) | best ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for task in report:
        if args.only and args.only not in task.id:
            continue
        try:
            warmup = 5 if args.device.startswith("cuda") else 1  # cuBLAS/cuDNN handles, autotuning
            outputs, seconds, best, deterministic, finite = run_task(
                task, args.device, repeats=repeats, warmup=warmup
            )
            shape = "x".join(map(str, outputs[0].shape)) + f" {str(outputs[0].dtype).replace('torch.', '')}"
            status = (
                ""
                if (deterministic and finite)
                else (" NONDETERMINISTIC" if not deterministic else " NONFINITE")
            )
            failures += bool(status)
        except Exception as error:  # report and continue: one broken task must not hide the others
            shape, seconds, best, status = "-", math.nan, math.nan, f" ERROR {type(error).__name__}: {error}"
            failures += 1
        rows.append(
            {
                "id": task.id,
                "level": task.level,
                "tags": list(task.tags),
                "regime": regime(task),
                "hash": task.hash,
                "output": shape,
                "forward_ms": seconds * 1e3,
                "best_ms": best * 1e3,
                "status": status.strip(),
            }
        )
        print(
            f"| {task.id} | {', '.join(task.tags)} | {regime(task)} | {shape} "
            f"| {seconds * 1e3:.3f} | {best * 1e3:.3f}{status} |",
            flush=True,
        )
    total = sum(r["forward_ms"] for r in rows if not math.isnan(r["forward_ms"]))
    total_best = sum(r["best_ms"] for r in rows if not math.isnan(r["best_ms"]))
    print(
        f"\n{len(rows)} tasks, {failures} failures, sum of median forward times {total:.1f} ms, "
        f"of best times {total_best:.1f} ms "
        f"(size={args.size}, device={args.device}, threads={torch.get_num_threads()}, "
        f"torch {torch.__version__}), "
        f"wall {time.perf_counter() - total_start:.1f} s"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "size": args.size,
            "device": args.device,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        }
        Path(args.json).write_text(json.dumps({"meta": meta, "tasks": rows}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
