"""GPU filters of the generated table (Ops-6K's): eager 1-100 ms on the GPU, and torch.compile runs.

Resumable: verdicts are appended to --verdicts (default: gpu_verdicts.jsonl beside the table) as each
task finishes; a run skips the (task, stage) pairs already there, sends no task after --max-seconds,
and ends by writing the per-task summary gpu_verdicts.parquet beside the log. On the H200 (see
bench/h200_filter_generated.sh; `time` first, with the GPU to itself, then `compile` in parallel
workers on the tasks whose time passed):
    python datasets/ops_gen/filter_gpu.py --stage time --device cuda --max-seconds 480
    python datasets/ops_gen/filter_gpu.py --stage compile --device cuda --workers 12 --max-seconds 330
    python datasets/ops_gen/filter_gpu.py --stage time --only datasets/recorded/h200/selection.txt
CPU smoke test (size small; what the GPU run does, on a few tasks; backend eager skips inductor):
    python datasets/ops_gen/filter_gpu.py --stage time --device cpu --limit 3 --verdicts /tmp/v.jsonl
    python datasets/ops_gen/filter_gpu.py --stage compile --device cpu --limit 3 --verdicts /tmp/v.jsonl

Task code runs only in the worker processes (autoprofiler/generate/_worker.py), never here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from autoprofiler.generate.checks import compile_job, gpu_time_job  # noqa: E402
from autoprofiler.generate.pool import JobResult, WorkerPool  # noqa: E402
from autoprofiler.generate.verdicts import (  # noqa: E402
    TASK_COLUMNS,
    append_verdict,
    read_verdicts,
    verdict_row,
    write_summary,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("time", "compile"), required=True)
    parser.add_argument("--table", default=str(HERE / "tasks.parquet"))
    parser.add_argument("--verdicts", default="", help="the log (default: gpu_verdicts.jsonl beside --table)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--size", choices=("auto", "full", "small"), default="auto", help="auto: full on CUDA"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="default: 1 for time; CPUs - 2 (at most 12) for compile"
    )
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="s per task (default: 120 time, 300 compile)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=0.0, help="send no task after this (0: no limit)"
    )
    parser.add_argument("--limit", type=int, default=0, help="at most this many tasks (0: all)")
    parser.add_argument(
        "--only", default="", help="a file of task hashes (its last column; '#' comments): only those"
    )
    parser.add_argument(
        "--backend", default="", help="torch.compile backend (default: inductor; eager on CPU)"
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed eager forwards (after 3 warm-up)")
    parser.add_argument(
        "--all", action="store_true", help="compile: also tasks whose time failed or is missing"
    )
    args = parser.parse_args(argv)
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if not Path(args.table).is_file():
        parser.error(f"--table {args.table}: no such file")
    if args.only and not Path(args.only).is_file():
        parser.error(f"--only {args.only}: no such file")
    if args.workers < 0 or args.limit < 0 or args.repeats < 1:
        parser.error("--workers and --limit must be >= 0, --repeats >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import pyarrow.parquet as pq

    cuda = args.device.startswith("cuda")
    size = args.size if args.size != "auto" else ("full" if cuda else "small")
    workers = args.workers or (1 if args.stage == "time" else max(1, min(12, (os.cpu_count() or 2) - 2)))
    timeout_s = args.timeout or (120.0 if args.stage == "time" else 300.0)
    backend = args.backend or ("inductor" if cuda else "eager")
    log_path = Path(args.verdicts) if args.verdicts else Path(args.table).with_name("gpu_verdicts.jsonl")
    columns = [*TASK_COLUMNS, "code"]
    tasks = table_tasks = pq.read_table(args.table, columns=columns).to_pylist()
    if args.only:
        lines = [ln.split()[-1] for ln in Path(args.only).read_text().splitlines() if ln.strip()]
        only = [h for h in lines if not h.startswith("#")]
        by_hash = {t["hash"]: t for t in tasks}
        tasks = [by_hash[h] for h in only if h in by_hash]  # in the file's order
    verdicts = read_verdicts(log_path)

    # -- which tasks: not yet done at this stage, or out of memory while sharing the GPU -------------
    def pending(task: dict) -> bool:
        row = verdicts.get((task["hash"], args.stage))
        if row is not None and not (row["kind"] == "oom" and row.get("workers", 1) > 1):
            return False
        return args.stage == "time" or args.all or bool(verdicts.get((task["hash"], "time"), {}).get("ok"))

    todo = [t for t in tasks if pending(t)]
    if args.limit:
        todo = todo[: args.limit]
    print(
        f"{args.stage}: {len(todo)} tasks to run of {len(tasks)} ({len(verdicts)} verdicts in {log_path}); "
        f"device {args.device}, size {size}, {workers} workers, {timeout_s:g} s per task",
        flush=True,
    )

    def job(task: dict) -> dict:
        if args.stage == "time":
            return gpu_time_job(task["hash"], task["code"], args.device, size, repeats=args.repeats)
        return compile_job(task["hash"], task["code"], args.device, size, backend)

    context = {"device": args.device, "size": size, "workers": workers, "date": time.strftime("%Y-%m-%d")}
    counts = {"ok": 0, "failed": 0}

    def record(batch: list[dict]):
        def on_result(index: int, result: JobResult) -> None:
            row = verdict_row(
                batch[index]["hash"],
                args.stage,
                result.ok,
                result.kind,
                result.reason,
                result.data,
                {**context, "seconds": result.seconds},
            )
            append_verdict(log_path, row)
            counts["ok" if row["ok"] else "failed"] += 1
            done = counts["ok"] + counts["failed"]
            if done % 25 == 0 or not row["ok"]:
                print(
                    f"  {done}/{len(todo)} {row['hash']} ok={row['ok']} {row['kind']} {row['reason'][:120]}",
                    flush=True,
                )

        return on_result

    workers = max(1, min(workers, len(todo)))
    # -- run: all workers share the GPU's memory; an out-of-memory task gets the GPU alone afterwards ---
    stop_at = time.monotonic() + args.max_seconds if args.max_seconds else None
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1"} if args.stage == "compile" else {}
    fraction = (0.9 / workers) if cuda and workers > 1 else 0.0
    threads = 1 if workers > 1 or not cuda else max(1, (os.cpu_count() or 2) - 1)
    with WorkerPool(
        workers,
        timeout_s,
        args.device,
        memory_limit_gb=0.0 if cuda else 8.0,
        threads=threads,
        memory_fraction=fraction,
        env=env,
    ) as pool:
        pool.run([job(t) for t in todo], on_result=record(todo), stop_at=stop_at)
    verdicts = read_verdicts(log_path)
    retry = [t for t in todo if verdicts.get((t["hash"], args.stage), {}).get("kind") == "oom"]
    if retry and workers > 1 and (stop_at is None or time.monotonic() < stop_at):
        print(f"retrying {len(retry)} out-of-memory tasks with the device to one worker", flush=True)
        context["workers"] = 1
        with WorkerPool(1, timeout_s, args.device, memory_limit_gb=0.0 if cuda else 8.0, env=env) as pool:
            pool.run([job(t) for t in retry], on_result=record(retry), stop_at=stop_at)

    verdicts = read_verdicts(log_path)
    summary = write_summary(table_tasks, verdicts, log_path.with_suffix(".parquet"))
    remaining = sum(pending(t) for t in tasks)
    print(
        f"{args.stage}: {counts['ok']} passed, {counts['failed']} failed this run; remaining {remaining}; "
        f"summary -> {summary}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
