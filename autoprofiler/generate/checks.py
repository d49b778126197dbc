"""The checks generated tasks go through, as jobs for the worker pool (``pool.py``, ``_worker.py``).

- ``cpu_job``: the cheap CPU check every recorded task passed: builds, runs at the small size, output
  shape and dtype as the chain predicts, finite, not constant, deterministic (two builds and runs from
  the same seed give identical outputs), sensitive to its inputs, and at the full size on the ``meta``
  device builds and gives the predicted shape (no memory is allocated).
- ``gpu_time_job``: eager run at the full size on the GPU: finite, deterministic, median eager time and
  peak memory (the 1-100 ms filter is applied to its result by ``gpu_verdict``).
- ``compile_job``: ``torch.compile`` runs and how far its output is from eager.

Example:
    >>> from autoprofiler.generate.compose import generate_task
    >>> job = cpu_job(generate_task(1))
    >>> job["kind"], job["small_shape"][0]
    ('cpu_check', 2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autoprofiler.generate.compose import GeneratedTask
from autoprofiler.generate.pool import JobResult, WorkerPool

EAGER_MS_RANGE = (1.0, 100.0)  # Ops-6K keeps tasks whose eager forward takes 1-100 ms on the GPU


def cpu_job(task: GeneratedTask, seed: int = 0) -> dict:
    """The CPU-check job of ``task`` (the worker compares the outputs with these predictions)."""
    return {
        "kind": "cpu_check",
        "id": task.hash,
        "source": task.code,
        "seed": seed,
        "small_shape": list(task.small_shape),
        "full_shape": list(task.full_shape),
        "output_dtype": task.output_dtype,
    }


def gpu_time_job(
    task_hash: str, code: str, device: str, size: str, warmup: int = 3, repeats: int = 10
) -> dict:
    return {
        "kind": "gpu_time",
        "id": task_hash,
        "source": code,
        "device": device,
        "size": size,
        "warmup": warmup,
        "repeats": repeats,
        "seed": 0,
    }


def compile_job(task_hash: str, code: str, device: str, size: str, backend: str = "inductor") -> dict:
    return {
        "kind": "compile",
        "id": task_hash,
        "source": code,
        "device": device,
        "size": size,
        "backend": backend,
        "seed": 0,
    }


def check_on_cpu(
    tasks: Sequence[GeneratedTask],
    workers: int = 2,
    timeout_s: float = 60.0,
    on_result: Callable[[int, JobResult], None] | None = None,
    timeouts: Sequence[float | None] | None = None,
) -> list[JobResult]:
    """Run the CPU check of every task in ``workers`` subprocesses; one result per task, in order.

    ``timeouts`` (one per task, ``None`` for the default) overrides ``timeout_s`` per task.

    Example:
        >>> from autoprofiler.generate.compose import generate_task
        >>> [r.ok for r in check_on_cpu([generate_task(s) for s in range(3)])]   # doctest: +SKIP
        [True, True, True]
    """
    with WorkerPool(workers=workers, timeout_s=timeout_s, device="cpu") as pool:
        jobs = [cpu_job(task) for task in tasks]
        for job, limit in zip(jobs, timeouts or [None] * len(jobs), strict=True):
            if limit is not None:
                job["timeout_s"] = limit
        results = pool.run(jobs, on_result=on_result)
    return [results[i] for i in range(len(tasks))]


def time_verdict(eager_ms: float, low_high: tuple[float, float] = EAGER_MS_RANGE) -> str:
    """``""`` when the eager time is within ``low_high`` (ms), else why not.

    >>> time_verdict(0.4), time_verdict(12.0), time_verdict(250.0)
    ('eager 0.4 ms < 1 ms', '', 'eager 250 ms > 100 ms')
    """
    low, high = low_high
    if eager_ms < low:
        return f"eager {eager_ms:g} ms < {low:g} ms"
    if eager_ms > high:
        return f"eager {eager_ms:g} ms > {high:g} ms"
    return ""
