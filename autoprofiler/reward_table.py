"""Reward and profile tables on disk: a directory of Parquet part files, appended in small batches.

A table directory holds ``part-*.parquet`` files that all share one Arrow schema. Writers append rows
in small batches (each batch becomes one new part file, written to a temporary name and renamed, so a
crash never leaves half a file); readers take the union of all parts. Rows are keyed (for rewards:
``rewards.outcome_key`` over ``REWARD_KEY_COLUMNS``); when two parts hold the same key the first written
wins and ``dedupe`` rewrites the directory as one file with each key once.

Only ``pyarrow`` is used here (no Ray, no polars), so this module imports on the GPU machine too.

Example:
    >>> import tempfile
    >>> from autoprofiler.rewards import outcome_key
    >>> d = tempfile.mkdtemp()
    >>> table = RewardTable(d, flush_every=1)
    >>> row = {"key": outcome_key("abc", "memory", "rule-v1", 0, 0), "task_hash": "abc", "speedup": 1.5}
    >>> table.append(row)
    True
    >>> RewardTable(d).get(row["key"])["speedup"]
    1.5
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from autoprofiler.rewards import REWARD_SCHEMA

__all__ = [
    "PROFILE_SCHEMA",
    "ParquetTable",
    "ProfileTable",
    "RewardTable",
    "read_rows",
    "write_rows",
]

logger = logging.getLogger(__name__)

# One row per (task, metric group) collected: its cost, and the profile the group brought (JSON of the
# ``Profile`` restricted to that group). A replay merges the rows of the groups it is asked for.
PROFILE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),  # f"{task_hash}/{source}/{group}"
        ("task_id", pa.string()),
        ("task_hash", pa.string()),
        ("level", pa.int32()),
        ("source", pa.string()),  # "ncu" | "torch"
        ("group", pa.string()),  # a metric group name (autoprofiler.profiling.GROUPS)
        ("passes", pa.int64()),
        ("seconds", pa.float64()),
        ("device", pa.string()),
        ("profile_json", pa.string()),  # Profile as JSON (see environments.profile_to_dict)
        ("run_id", pa.string()),
        ("created_at", pa.timestamp("s", tz="UTC")),
    ]
)


def _coerce(row: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """A row with exactly the schema's columns (missing ones None); unknown columns are an error."""
    unknown = set(row) - set(schema.names)
    if unknown:
        raise ValueError(
            f"row has columns not in the table schema: {sorted(unknown)}; expected a subset of {schema.names}"
        )
    out = {name: row.get(name) for name in schema.names}
    if "created_at" in out and out["created_at"] is None:
        out["created_at"] = _dt.datetime.now(_dt.UTC).replace(microsecond=0)
    return out


def write_rows(path: str | Path, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    """Write rows to one Parquet file atomically (temporary name, then rename). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([_coerce(r, schema) for r in rows], schema=schema)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a Parquet file or of every ``*.parquet`` part in a directory, in write order."""
    path = Path(path)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return rows


class ParquetTable:
    """A keyed table stored as Parquet part files in one directory.

    Args:
        directory: where the parts live (created on first flush).
        schema: the Arrow schema every row follows; it must have a ``key`` column.
        flush_every: rows buffered before a part file is written (small: a crash loses at most these).

    Rows are available to ``get``/``__contains__`` as soon as they are appended (buffered or not).
    Parts are named ``part-<UTC time>-<random>.parquet`` so sorting the names gives write order.
    """

    def __init__(self, directory: str | Path, schema: pa.Schema, flush_every: int = 8):
        if "key" not in schema.names:
            raise ValueError(f"a ParquetTable schema needs a 'key' column; got {schema.names}")
        self._lock = threading.RLock()  # appends may come from several evaluation threads
        self.directory = Path(directory)
        self.schema = schema
        self.flush_every = max(1, int(flush_every))
        self._rows: dict[str, dict[str, Any]] = {}
        self._pending: list[dict[str, Any]] = []
        self.duplicates_seen = 0
        self.reload()

    def reload(self) -> None:
        """Re-read every part on disk (pending rows stay pending)."""
        self._rows = {}
        if self.directory.is_dir():
            for row in read_rows(self.directory):
                if row["key"] in self._rows:
                    self.duplicates_seen += 1
                    continue
                self._rows[row["key"]] = row
        for row in self._pending:
            self._rows.setdefault(row["key"], row)

    def __contains__(self, key: str) -> bool:
        return key in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(list(self._rows.values()))

    def get(self, key: str) -> dict[str, Any] | None:
        """The row with that key, or None."""
        return self._rows.get(key)

    def rows(self) -> list[dict[str, Any]]:
        """Every row, each key once, in write order."""
        return list(self._rows.values())

    def append(self, row: dict[str, Any]) -> bool:
        """Add one row; a key already present is ignored (returns False). Flushes every ``flush_every``."""
        row = _coerce(row, self.schema)
        if not row.get("key"):
            raise ValueError(f"a row needs a non-empty 'key'; got {row.get('key')!r}")
        with self._lock:
            if row["key"] in self._rows:
                return False
            self._rows[row["key"]] = row
            self._pending.append(row)
            if len(self._pending) >= self.flush_every:
                self.flush()
            return True

    def extend(self, rows: Iterable[dict[str, Any]]) -> int:
        """Append many rows; returns how many were new."""
        return sum(self.append(r) for r in rows)

    def flush(self) -> Path | None:
        """Write pending rows as one new part file; returns its path (None when nothing was pending)."""
        with self._lock:
            if not self._pending:
                return None
            stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")
            path = self.directory / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
            write_rows(path, self._pending, self.schema)
            logger.debug("wrote %d rows to %s", len(self._pending), path)
            self._pending = []
            return path

    def dedupe(self) -> Path | None:
        """Flush, then rewrite the directory as a single part with every key exactly once.

        The merged part is written (atomically) before the old parts are removed, and its name sorts
        first, so a crash in between leaves duplicates that readers already resolve the same way.
        """
        self.flush()
        self.reload()
        old = sorted(self.directory.glob("part-*.parquet")) if self.directory.is_dir() else []
        if not self._rows:
            return None
        path = self.directory / f"part-00000000T000000000000-merged-{uuid.uuid4().hex[:8]}.parquet"
        write_rows(path, list(self._rows.values()), self.schema)
        for f in old:
            f.unlink()
        self.duplicates_seen = 0
        return path

    def to_arrow(self) -> pa.Table:
        """All rows (each key once) as an Arrow table with the schema."""
        return pa.Table.from_pylist(list(self._rows.values()), schema=self.schema)

    def close(self) -> None:
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RewardTable(ParquetTable):
    """The reward table: rows of ``rewards.REWARD_SCHEMA`` keyed by ``rewards.outcome_key``."""

    def __init__(self, directory: str | Path, flush_every: int = 8):
        super().__init__(directory, REWARD_SCHEMA, flush_every)


class ProfileTable(ParquetTable):
    """Recorded profiles: rows of ``PROFILE_SCHEMA``, one per (task, source, group)."""

    def __init__(self, directory: str | Path, flush_every: int = 8):
        super().__init__(directory, PROFILE_SCHEMA, flush_every)

    @staticmethod
    def make_key(task_hash: str, source: str, group: str) -> str:
        return f"{task_hash}/{source}/{group}"

    def groups_for(self, task_hash: str, source: str | None = None) -> dict[str, dict[str, Any]]:
        """``{group: row}`` recorded for a task (optionally for one source)."""
        return {
            r["group"]: r
            for r in self._rows.values()
            if r["task_hash"] == task_hash and (source is None or r["source"] == source)
        }


def dumps(obj: Any) -> str:
    """Deterministic compact JSON (sorted keys; NaN/inf kept as JSON extensions Python reads back)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
