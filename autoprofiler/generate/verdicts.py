"""Verdicts of the GPU filters, stored beside the task table.

``gpu_verdicts.jsonl`` is the durable log: one line per (task hash, stage) result, appended as each
job finishes, so a run cut off by a time limit loses at most the jobs in flight and the next run
resumes from it (a later line for the same hash and stage wins). ``gpu_verdicts.parquet`` is the
per-task summary written from the log: one row per task of the table.

Stages: ``time`` (eager at full size on the GPU: finite, deterministic, median ms, peak memory; passes
when the median is within 1-100 ms) and ``compile`` (``torch.compile`` runs; the difference from eager
is recorded). ``keep`` is true when both passed: the Ops-6K filter.
"""

from __future__ import annotations

import json
from pathlib import Path

from autoprofiler.generate.checks import time_verdict

STAGES = ("time", "compile")
#: the columns of the task table that ``write_summary`` reads
TASK_COLUMNS = ("hash", "data_source", "dtype", "est_full_ms", "est_full_peak_gib")
SUMMARY_COLUMNS = (
    "hash",
    "data_source",
    "dtype",
    "est_full_ms",
    "est_full_peak_gib",
    "time_ok",
    "eager_ms",
    "peak_gib",
    "time_kind",
    "time_reason",
    "compile_ok",
    "compile_s",
    "max_abs_diff",
    "rel_norm_diff",
    "compile_kind",
    "compile_reason",
    "keep",
)


def read_verdicts(path: str | Path) -> dict[tuple[str, str], dict]:
    """``{(hash, stage): the last line for it}``; a missing file is empty, a truncated last line skipped."""
    path = Path(path)
    verdicts: dict[tuple[str, str], dict] = {}
    if not path.is_file():
        return verdicts
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut off when a run was killed
        if isinstance(row, dict) and "hash" in row and row.get("stage") in STAGES:
            verdicts[(row["hash"], row["stage"])] = row
    return verdicts


def append_verdict(path: str | Path, row: dict) -> None:
    with Path(path).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, allow_nan=True) + "\n")


def verdict_row(
    task_hash: str, stage: str, ok: bool, kind: str, reason: str, data: dict, context: dict
) -> dict:
    """A log line: the job's outcome plus ``time_ok`` for the time stage (1-100 ms) and the run context."""
    row = {"hash": task_hash, "stage": stage, "ok": ok, "kind": kind, "reason": reason, **data, **context}
    if stage == "time" and ok:
        why = time_verdict(float(data["eager_ms"]))
        row.update(ok=not why, kind="" if not why else "eager_time", reason=why)
    return row


def summary_rows(tasks: list[dict], verdicts: dict[tuple[str, str], dict]) -> list[dict]:
    """One row per task (``SUMMARY_COLUMNS``); ``None`` where a stage has not run."""
    rows = []
    for task in tasks:
        timed = verdicts.get((task["hash"], "time"))
        compiled = verdicts.get((task["hash"], "compile"))
        rows.append(
            {
                "hash": task["hash"],
                "data_source": task["data_source"],
                "dtype": task["dtype"],
                "est_full_ms": task["est_full_ms"],
                "est_full_peak_gib": task["est_full_peak_gib"],
                "time_ok": None if timed is None else bool(timed["ok"]),
                "eager_ms": None if timed is None else timed.get("eager_ms"),
                "peak_gib": None if timed is None else timed.get("peak_gib"),
                "time_kind": None if timed is None else timed["kind"],
                "time_reason": None if timed is None else timed["reason"],
                "compile_ok": None if compiled is None else bool(compiled["ok"]),
                "compile_s": None if compiled is None else compiled.get("compile_s"),
                "max_abs_diff": None if compiled is None else compiled.get("max_abs_diff"),
                "rel_norm_diff": None if compiled is None else compiled.get("rel_norm_diff"),
                "compile_kind": None if compiled is None else compiled["kind"],
                "compile_reason": None if compiled is None else compiled["reason"],
                "keep": None
                if timed is None or compiled is None
                else bool(timed["ok"]) and bool(compiled["ok"]),
            }
        )
    return rows


def write_summary(tasks: list[dict], verdicts: dict[tuple[str, str], dict], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("hash", pa.string()),
            ("data_source", pa.string()),
            ("dtype", pa.string()),
            ("est_full_ms", pa.float64()),
            ("est_full_peak_gib", pa.float64()),
            ("time_ok", pa.bool_()),
            ("eager_ms", pa.float64()),
            ("peak_gib", pa.float64()),
            ("time_kind", pa.string()),
            ("time_reason", pa.string()),
            ("compile_ok", pa.bool_()),
            ("compile_s", pa.float64()),
            ("max_abs_diff", pa.float64()),
            ("rel_norm_diff", pa.float64()),
            ("compile_kind", pa.string()),
            ("compile_reason", pa.string()),
            ("keep", pa.bool_()),
        ]
    )
    path = Path(path)
    pq.write_table(
        pa.Table.from_pylist(summary_rows(tasks, verdicts), schema=schema), path, compression="zstd"
    )
    return path
