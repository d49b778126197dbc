"""Generate an Ops-6K-style task table: compose catalog ops, de-duplicate, CPU-check in subprocesses.

The committed table (6,000 tasks, seed 0; the CPU check runs in 2 worker processes):
    python datasets/ops_gen/make.py --count 6000 --seed 0 --workers 2

Tasks of a chosen size, e.g. one forward's estimated peak memory ~35 GiB (1/4 of an H200's 141 GB),
for memory tests of the evaluator (the same chains as the committed table's first candidates, a larger
batch; tensors may pass 2**31 elements, which most but not all CUDA kernels support):
    python datasets/ops_gen/make.py --count 4 --seed 0 --peak-gib 35 --max-tensor-elems 17179869184 \
        --out /tmp/ops_gen_35gib

Writes into --out (default: this folder): tasks.parquet (``code``, ``ops``, ``data_source`` = ``torch#k``
and more columns, see autoprofiler/generate/dataset.py), rejected.parquet (candidate, seed, hash,
stage, kind, reason), stats.json (the config, counts, coverage, timings). Then loads tasks.parquet with
autoprofiler.tasks.load_ops_table and exits 1 if any row fails to load. The GPU filters
(torch.compile, 1-100 ms eager) are a separate step: bench/h200_filter_generated.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from autoprofiler.generate.catalog import CATALOG  # noqa: E402
from autoprofiler.generate.compose import GenerateConfig  # noqa: E402
from autoprofiler.generate.dataset import build_dataset, summarize, write_tables  # noqa: E402
from autoprofiler.tasks import TaskLoadError, load_ops_table  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=6000, help="tasks to keep (default 6000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="CPU-check worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per task in the CPU check")
    parser.add_argument("--out", default=str(HERE), help="output folder (default: datasets/ops_gen)")
    parser.add_argument(
        "--peak-gib", type=float, default=None, help="size by memory: one forward's peak (GiB)"
    )
    parser.add_argument(
        "--max-tensor-elems", type=int, default=2**31 - 1, help="elements of any full-size tensor"
    )
    parser.add_argument("--max-peak-gib", type=float, default=8.0, help="time sizing: peak memory cap (GiB)")
    parser.add_argument("--target-ms", type=float, nargs=2, default=(2.0, 50.0), metavar=("LOW", "HIGH"))
    args = parser.parse_args(argv)
    problems = []
    if args.count < 1:
        problems.append(f"--count must be >= 1, got {args.count}")
    if args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    if args.timeout <= 0:
        problems.append(f"--timeout must be > 0, got {args.timeout}")
    if problems:
        parser.error("; ".join(problems))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = GenerateConfig(
            target_ms=tuple(args.target_ms),
            max_peak_gib=args.max_peak_gib,
            peak_gib=args.peak_gib,
            max_tensor_elems=args.max_tensor_elems,
        )
    except ValueError as error:
        print(f"make.py: error: {error}", file=sys.stderr)
        return 2
    print(f"catalog: {len(CATALOG)} ops; config: {config}", flush=True)

    start = time.perf_counter()
    data = build_dataset(
        args.count,
        args.seed,
        config,
        workers=args.workers,
        timeout_s=args.timeout,
        progress=lambda line: print(line, flush=True),
    )
    wall_s = time.perf_counter() - start
    task_path, rejected_path = write_tables(data, args.out)

    try:
        report = load_ops_table(task_path)
    except TaskLoadError as error:
        print(f"make.py: error: the table does not load: {error}", file=sys.stderr)
        return 1
    stats = summarize(data)
    small_ms = sorted(data.small_ms)
    stats.update(
        command=" ".join(
            ["python", "datasets/ops_gen/make.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        seed=args.seed,
        config={k: v for k, v in config.__dict__.items()},
        wall_s=round(wall_s, 2),
        loaded=len(report),
        load_errors=len(report.errors),
        cpu_small_ms_median=small_ms[len(small_ms) // 2] if small_ms else None,
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        torch=__import__("torch").__version__,
        date=time.strftime("%Y-%m-%d"),
        sizes_kib={p.name: round(p.stat().st_size / 1024, 1) for p in (task_path, rejected_path)},
    )
    (Path(args.out) / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")

    print(
        f"\n{len(data.tasks)} tasks -> {task_path} ({stats['sizes_kib'][task_path.name]} KiB); "
        f"{len(data.rejected)} rejected -> {rejected_path}"
    )
    print(f"rejected by reason: {stats['rejected']}")
    print(f"dtypes: {stats['dtypes']}; ops per task: {stats['ops_per_task']}")
    print(
        f"generate {data.generate_s:.1f} s, CPU check {data.check_s:.1f} s, wall {wall_s:.1f} s "
        f"({args.workers} workers)"
    )
    print(f"load_ops_table: {len(report)} tasks, {len(report.errors)} errors")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
