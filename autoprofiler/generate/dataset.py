"""From a seed to an Ops-6K-style table: generate, de-duplicate, CPU-check, keep ``count`` tasks.

Candidate ``k`` of a run with seed ``s`` is ``generate_task(task_seed(s, k))``. Candidates are taken in
order of ``k``: a duplicate of an earlier candidate's content hash, a seed that composes nothing and a
task failing the CPU check are recorded as rejections (with the reason); the first ``count`` that pass
are the table. Candidates past the ``count``-th accepted one are dropped unrecorded, so the same seed
gives the same table whatever order the workers finished in.

Tables (Parquet):
- tasks: ``code``, ``ops`` (torch API names), ``data_source`` (``torch#k``) - the columns
  ``autoprofiler.tasks.load_ops_table`` reads - then ``hash``, ``seed``, ``candidate``, ``op_names``
  (catalog keys), ``families``, ``dtype``, ``input_layout``, ``size_class``, ``full_batch``,
  ``small_shape``, ``full_shape``, ``output_dtype``, ``est_full_ms``, ``est_full_peak_gib``.
- rejected: ``candidate``, ``seed``, ``hash``, ``op_names``, ``dtype``, ``stage`` (``compose``,
  ``duplicate``, ``cpu_check``), ``kind`` (short reason), ``reason`` (text).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autoprofiler.generate.catalog import CATALOG
from autoprofiler.generate.checks import check_on_cpu
from autoprofiler.generate.compose import ComposeError, GenerateConfig, GeneratedTask, generate_task
from autoprofiler.generate.pool import JobResult
from autoprofiler.generate.spec import Op

log = logging.getLogger(__name__)

TASK_COLUMNS = (
    "code",
    "ops",
    "data_source",
    "hash",
    "seed",
    "candidate",
    "op_names",
    "families",
    "dtype",
    "input_layout",
    "size_class",
    "full_batch",
    "small_shape",
    "full_shape",
    "output_dtype",
    "est_full_ms",
    "est_full_peak_gib",
)
REJECTED_COLUMNS = ("candidate", "seed", "hash", "op_names", "dtype", "stage", "kind", "reason")


def task_seed(seed: int, candidate: int) -> int:
    """The seed of candidate ``candidate`` of a run seeded ``seed`` (distinct for every pair below 10**9).

    >>> task_seed(0, 5), task_seed(1, 5)
    (5, 1000000005)
    """
    return seed * 10**9 + candidate


@dataclass(frozen=True)
class Rejection:
    candidate: int
    seed: int
    hash: str
    op_names: tuple[str, ...]
    dtype: str
    stage: str
    kind: str
    reason: str


@dataclass
class Dataset:
    """The accepted tasks (in candidate order), their candidate numbers, the rejections, and the
    seconds spent generating and checking."""

    tasks: list[GeneratedTask] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    generate_s: float = 0.0
    check_s: float = 0.0
    small_ms: list[float] = field(default_factory=list)

    def reject_counts(self) -> Counter:
        return Counter(f"{r.stage}:{r.kind}" for r in self.rejected)


def build_dataset(
    count: int,
    seed: int = 0,
    config: GenerateConfig | None = None,
    catalog: dict[str, Op] | None = None,
    workers: int = 2,
    timeout_s: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> Dataset:
    """Generate and CPU-check candidates until ``count`` distinct tasks pass.

    Args:
        count: tasks to keep.
        seed: the run's seed (candidate seeds come from ``task_seed``).
        config, catalog: passed to ``generate_task``.
        workers, timeout_s: the CPU check's worker processes and per-task limit.
        progress: called with a line of text after each batch.

    Raises:
        ValueError: ``count < 1``, or no candidate passes in a whole batch of candidates (a broken catalog).
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    catalog = CATALOG if catalog is None else catalog
    data, seen, candidate = Dataset(), {}, 0  # seen: content hash -> first candidate
    passed: list[tuple[int, GeneratedTask, JobResult]] = []
    rejected: list[Rejection] = []
    while len(passed) < count:
        need = count - len(passed)
        batch_size = need + need // 8 + 8
        batch: list[tuple[int, GeneratedTask]] = []
        start = time.perf_counter()
        generated = []
        for k in range(candidate, candidate + batch_size):
            try:
                generated.append((k, generate_task(task_seed(seed, k), catalog, config)))
            except ComposeError as error:
                rejected.append(
                    Rejection(k, task_seed(seed, k), "", (), "", "compose", "no_chain", str(error))
                )
        batch, duplicates = dedupe(generated, seen)
        rejected += duplicates
        candidate += batch_size
        data.generate_s += time.perf_counter() - start
        start = time.perf_counter()
        results = check_on_cpu([task for _, task in batch], workers=workers, timeout_s=timeout_s)
        data.check_s += time.perf_counter() - start
        newly = 0
        for (k, task), result in zip(batch, results, strict=True):
            if result.ok:
                passed.append((k, task, result))
                newly += 1
            else:
                rejected.append(_rejection(k, task, "cpu_check", result.kind, result.reason))
        if progress is not None:
            progress(
                f"candidates {candidate}: {len(passed)}/{count} passed, {len(rejected)} rejected "
                f"(generate {data.generate_s:.1f} s, check {data.check_s:.1f} s)"
            )
        if newly == 0:
            raise ValueError(
                f"none of {len(batch)} candidates passed the CPU check: {Counter(r.kind for r in rejected)}"
            )
    passed.sort(key=lambda item: item[0])
    last = passed[count - 1][0]
    data.tasks = [task for k, task, _ in passed[:count]]
    data.candidates = [k for k, _, _ in passed[:count]]
    data.small_ms = [result.data.get("small_ms", 0.0) for _, _, result in passed[:count]]
    data.rejected = sorted((r for r in rejected if r.candidate <= last), key=lambda r: r.candidate)
    return data


def dedupe(
    tasks: list[tuple[int, GeneratedTask]], seen: dict[str, int]
) -> tuple[list[tuple[int, GeneratedTask]], list[Rejection]]:
    """Split ``(candidate, task)`` pairs into the first of each content hash and rejections for the rest.

    ``seen`` maps the hashes of earlier candidates to their candidate numbers and is updated.

    >>> from autoprofiler.generate.compose import generate_task
    >>> task = generate_task(1)
    >>> kept, dropped = dedupe([(0, task), (1, task)], {})
    >>> [k for k, _ in kept], [(r.candidate, r.kind, r.reason) for r in dropped]
    ([0], [(1, 'duplicate', 'same content hash as candidate 0')])
    """
    kept, rejected = [], []
    for k, task in tasks:
        if task.hash in seen:
            reason = f"same content hash as candidate {seen[task.hash]}"
            rejected.append(_rejection(k, task, "duplicate", "duplicate", reason))
            continue
        seen[task.hash] = k
        kept.append((k, task))
    return kept, rejected


def _rejection(candidate: int, task: GeneratedTask, stage: str, kind: str, reason: str) -> Rejection:
    return Rejection(candidate, task.seed, task.hash, task.ops, task.dtype, stage, kind, reason)


def task_row(task: GeneratedTask, candidate: int) -> dict:
    """One row of the tasks table (``TASK_COLUMNS``)."""
    return {
        "code": task.code,
        "ops": list(task.apis),
        "data_source": task.data_source,
        "hash": task.hash,
        "seed": task.seed,
        "candidate": candidate,
        "op_names": list(task.ops),
        "families": list(task.families),
        "dtype": task.dtype,
        "input_layout": task.input_layout,
        "size_class": task.size_class,
        "full_batch": task.full_batch,
        "small_shape": list(task.small_shape),
        "full_shape": list(task.full_shape),
        "output_dtype": task.output_dtype,
        "est_full_ms": task.est_full_ms,
        "est_full_peak_gib": task.est_full_peak_gib,
    }


def write_tables(data: Dataset, folder: str | Path) -> tuple[Path, Path]:
    """Write ``tasks.parquet`` and ``rejected.parquet`` into ``folder``; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [task_row(task, k) for task, k in zip(data.tasks, data.candidates, strict=True)]
    tasks = pa.Table.from_pylist(rows) if rows else pa.table({name: [] for name in TASK_COLUMNS})
    schema = pa.schema(
        [
            ("candidate", pa.int64()),
            ("seed", pa.int64()),
            ("hash", pa.string()),
            ("op_names", pa.list_(pa.string())),
            ("dtype", pa.string()),
            ("stage", pa.string()),
            ("kind", pa.string()),
            ("reason", pa.string()),
        ]
    )
    rejected = pa.Table.from_pylist([asdict(r) for r in data.rejected], schema=schema)
    task_path, rejected_path = folder / "tasks.parquet", folder / "rejected.parquet"
    pq.write_table(tasks, task_path, compression="zstd")
    pq.write_table(rejected, rejected_path, compression="zstd")
    return task_path, rejected_path


def summarize(data: Dataset, catalog: dict[str, Op] | None = None) -> dict:
    """Counts for the README: tasks, rejections by reason, ops per task, dtypes, coverage per op."""
    catalog = CATALOG if catalog is None else catalog
    coverage = Counter(name for task in data.tasks for name in set(task.ops))
    return {
        "tasks": len(data.tasks),
        "candidates": (data.candidates[-1] + 1) if data.candidates else 0,
        "rejected": dict(sorted(data.reject_counts().items())),
        "ops_per_task": dict(sorted(Counter(len(t.ops) for t in data.tasks).items())),
        "dtypes": dict(sorted(Counter(t.dtype for t in data.tasks).items())),
        "input_layouts": dict(sorted(Counter(t.input_layout for t in data.tasks).items())),
        "families": dict(sorted(Counter(f for t in data.tasks for f in t.families).items())),
        "coverage": {name: coverage.get(name, 0) for name in sorted(catalog)},
        "generate_s": round(data.generate_s, 2),
        "check_s": round(data.check_s, 2),
    }
