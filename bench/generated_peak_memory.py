"""Measured vs estimated peak memory of generated tasks sized by memory (``GenerateConfig(peak_gib=...)``).

The generator sizes a task so that one full-size forward's *estimated* peak memory is a chosen amount
(the "task of a chosen size" for memory tests of the evaluator). This runs such tasks at full size, each
in a fresh worker process, and prints the measured peak next to the estimate.

CPU (what was run here; the measure is the worker's resident-set high-water increase over building the
model and inputs and one forward, so it also counts allocator slack):
    python bench/generated_peak_memory.py --device cpu --peak-gib 0.5 --count 30 \\
        --out bench/results/generated_peak_memory_cpu.md
H200 (not yet run; ``torch.cuda.max_memory_allocated``; ~1/4 of the GPU's memory):
    python bench/generated_peak_memory.py --device cuda --peak-gib 35 --count 20 \\
        --max-tensor-elems 17179869184 --out bench/results/generated_peak_memory_h200.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoprofiler.generate.checks import gpu_time_job  # noqa: E402
from autoprofiler.generate.compose import GenerateConfig, generate_task  # noqa: E402
from autoprofiler.generate.dataset import task_seed  # noqa: E402
from autoprofiler.generate.pool import WorkerPool  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--peak-gib", type=float, required=True)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tensor-elems", type=int, default=2**31 - 1)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if args.peak_gib <= 0 or args.count < 1:
        parser.error(f"--peak-gib must be > 0 and --count >= 1, got {args.peak_gib} and {args.count}")

    config = GenerateConfig(peak_gib=args.peak_gib, max_tensor_elems=args.max_tensor_elems)
    tasks = [generate_task(task_seed(args.seed, k), config=config) for k in range(args.count)]
    jobs = [gpu_time_job(t.hash, t.code, args.device, "full", warmup=0, repeats=1) for t in tasks]
    start = time.perf_counter()
    cpu = args.device == "cpu"
    with WorkerPool(
        1, args.timeout, args.device, memory_limit_gb=4 * args.peak_gib + 4 if cpu else 0.0, recycle_after=1
    ) as pool:
        results = pool.run(
            jobs, on_result=lambda i, r: print(f"  {i}: ok={r.ok} {r.kind} {r.data}", flush=True)
        )
    wall_s = time.perf_counter() - start

    command = " ".join(["python", "bench/generated_peak_memory.py", *(argv or sys.argv[1:])])
    lines = [
        f"Generated tasks sized to an estimated peak of {args.peak_gib:g} GiB, run at full size on "
        f"{args.device} (`{command}`, {time.strftime('%Y-%m-%d')}, {wall_s:.0f} s).",
        "",
        "| candidate | ops | dtype | batch | est. peak GiB | measured GiB | measured / est. | eager ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios, by_dtype = [], {}
    for k, (task, result) in enumerate(zip(tasks, [results[i] for i in range(len(tasks))], strict=True)):
        if not result.ok:
            lines.append(f"| {k} | {' -> '.join(task.ops)} | {task.dtype} | {task.full_batch} | "
                         f"{task.est_full_peak_gib:.3f} | {result.kind} | | |")  # fmt: skip
            continue
        measured, eager_ms = result.data["peak_gib"], result.data["eager_ms"]
        ratios.append(measured / task.est_full_peak_gib)
        by_dtype.setdefault(task.dtype, []).append(ratios[-1])
        cells = [k, " -> ".join(task.ops), task.dtype, task.full_batch, f"{task.est_full_peak_gib:.3f}"]
        cells += [f"{measured:.3f}", f"{ratios[-1]:.2f}", f"{eager_ms:.1f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if ratios:
        ratios.sort()
        within = sum(0.75 <= r <= 1.25 for r in ratios)
        source, median = results[0].data.get("peak_source", ""), statistics.median(ratios)
        lines += [
            "",
            f"{len(ratios)} of {len(tasks)} ran; measured / estimated peak: median {median:.2f}, "
            f"min {ratios[0]:.2f}, max {ratios[-1]:.2f}; within 0.75-1.25: {within}. Measure: {source}.",
            "By dtype (median, n): "
            + ", ".join(f"{d} {statistics.median(r):.2f} ({len(r)})" for d, r in sorted(by_dtype.items()))
            + ".",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
