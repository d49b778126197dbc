"""Keyed Parquet tables: rewards, profiles, candidate sources. One writer, one reader, versioned schemas.

A table is a directory of Parquet part files sharing one Arrow schema, partitioned by run
(``<table>/run=<run id>/part-<UTC time>-<id>.parquet``). Writers append rows in small batches, each
batch a new part: through Ray Data (``Dataset.write_parquet``) when the process is part of a Ray
cluster, so a driver writes to whatever filesystem the cluster shares, else with pyarrow (temporary
name, then rename). Readers take the union of every part below the directory in write order (part
names sort by time); when two parts hold the same key the first written wins, and ``dedupe`` rewrites
the directory as one part with each key once. A table can also read several directories (``read_from``:
e.g. the ``rewards/`` of two recordings replayed together): their union, each directory in the order
given, so on a key two of them hold the first directory's record wins; ``source_of(key)`` and
``rows_per_source()`` say which directory each record came from.

Every part carries its schema's name and version in the file metadata (``autoprofiler.schema``, e.g.
``reward/2``). Reading checks it: a part of the current version is read as is, a part of an older
version is upgraded row by row (``UPGRADES``), anything else is a ``TableSchemaError`` naming the file.

Only pyarrow is imported here (Ray only when it is already running), so this module loads on a GPU
machine without Ray. Summaries read tables with polars (``autoprofiler.analysis``).

Example:
    >>> import tempfile
    >>> table = ParquetTable(tempfile.mkdtemp(), CANDIDATE_SCHEMA, flush_every=1)
    >>> table.append({"key": "c0ffee", "task_hash": "abc", "source": "class ModelNew: ..."})
    True
    >>> ParquetTable(table.directory, CANDIDATE_SCHEMA).get("c0ffee")["task_hash"]
    'abc'
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from autoprofiler.rewards import REWARD_SCHEMA, SCHEMA_VERSION

__all__ = [
    "CANDIDATE_SCHEMA",
    "PROFILE_SCHEMA",
    "SCHEMA_KEY",
    "ParquetTable",
    "ProfileTable",
    "RewardTable",
    "TableSchemaError",
    "dumps",
    "profile_key",
    "read_table",
    "recording_folders",
]

logger = logging.getLogger(__name__)

SCHEMA_KEY = b"autoprofiler.schema"

# One row per (task, metric group, profiling environment): the group's cost and the profile it brought
# (JSON of the ``Profile`` restricted to that group). A replay merges the rows of the groups it is asked
# for; the profiler's cache looks rows up by key.
PROFILE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),  # profile_key(task_hash, source, group, device, driver, tool)
        ("task_id", pa.string()),
        ("task_hash", pa.string()),
        ("level", pa.int32()),
        ("source", pa.string()),  # "ncu" | "torch"
        ("group", pa.string()),  # a metric group name (autoprofiler.profiling.GROUPS)
        ("passes", pa.int64()),
        ("seconds", pa.float64()),
        ("profile_json", pa.string()),  # Profile.to_dict() as JSON
        # provenance
        ("device", pa.string()),
        ("driver", pa.string()),
        ("ncu_version", pa.string()),  # the tool: "ncu 2025.3.1.0" or "torch 2.13.0"
        ("torch_version", pa.string()),
        ("git_sha", pa.string()),
        ("git_dirty", pa.bool_()),
        ("run_id", pa.string()),
        ("worker", pa.string()),
        ("created_at", pa.timestamp("s", tz="UTC")),
    ]
)

# Candidate sources by content hash (what the reward rows' ``candidate_hash`` points to).
CANDIDATE_SCHEMA = pa.schema([("key", pa.string()), ("task_hash", pa.string()), ("source", pa.string())])

SCHEMAS = {"reward": REWARD_SCHEMA, "profile": PROFILE_SCHEMA, "candidate": CANDIDATE_SCHEMA}


class TableSchemaError(ValueError):
    """A part file whose schema name or version this code cannot read."""


def profile_key(
    task_hash: str, source: str, group: str, device: str = "", driver: str = "", tool: str = ""
) -> str:
    """Key of one recorded group: readable prefix, then a digest of where it was measured.

    >>> profile_key("abc", "ncu", "root", "NVIDIA H200", "580.159.04", "ncu 2025.3.1.0")[:13]
    'abc/ncu/root/'
    """
    where = hashlib.sha256("\x1f".join((device, driver, tool)).encode()).hexdigest()[:12]
    return f"{task_hash}/{source}/{group}/{where}"


# --- schema versions ---------------------------------------------------------------------------------
def _upgrade_reward_v1(row: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 kept a rule action's row as the configuration ``action:<name>``; 2 has a ``kind``."""
    configuration = row.get("configuration") or ""
    if configuration.startswith("action:"):
        row.update(kind="action", action=configuration[len("action:") :], configuration="")
    else:
        row["kind"] = "configuration"
    return row


def _upgrade_profile_v1(row: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 keyed profiles by task/source/group only; 2 adds where they were measured."""
    row["key"] = profile_key(row["task_hash"], row["source"], row["group"], row.get("device") or "")
    return row


#: (table name, version) -> a function upgrading one row of that version to the next.
UPGRADES: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("reward", 1): _upgrade_reward_v1,
    ("profile", 1): _upgrade_profile_v1,
    ("candidate", 1): lambda row: row,  # unchanged; version 1 had no tag
}


def _schema_tag(name: str) -> bytes:
    return f"{name}/{SCHEMA_VERSION}".encode()


def _file_version(schema: pa.Schema, name: str, path: Path) -> int:
    """The version of table ``name`` a part holds; a part without the tag is version 1 (before tags)."""
    tag = (schema.metadata or {}).get(SCHEMA_KEY)
    if tag is None:
        return 1
    got_name, _, version = tag.decode().partition("/")
    if got_name != name or not version.isdigit():
        raise TableSchemaError(f"{path}: holds a {tag.decode()!r} table, expected a {name!r} table")
    if int(version) > SCHEMA_VERSION:
        raise TableSchemaError(
            f"{path}: {name} schema version {version} is newer than this code reads ({SCHEMA_VERSION}); "
            "update autoprofiler"
        )
    return int(version)


#: rows converted to Python at a time when a part is read
READ_BATCH_ROWS = 4096


def _read_part(path: Path, name: str, schema: pa.Schema) -> list[dict[str, Any]]:
    """The rows of one part, upgraded to the current schema.

    Converted batch by batch: the whole part as one Arrow table beside its Python rows holds both at
    once, a transient as large as the decoded part (a recording's profile table is mostly per-kernel
    JSON: hundreds of MB for thousands of tasks).
    """
    with pq.ParquetFile(path) as part:
        file_schema = part.schema_arrow
        version = _file_version(file_schema, name, path)
        rows = [r for batch in part.iter_batches(batch_size=READ_BATCH_ROWS) for r in batch.to_pylist()]
    for v in range(version, SCHEMA_VERSION):
        upgrade = UPGRADES.get((name, v))
        if upgrade is None:
            raise TableSchemaError(f"{path}: no upgrade from {name} schema {v} to {v + 1}")
        rows = [upgrade(r) for r in rows]
    unknown = set(file_schema.names) - set(schema.names)
    if unknown:
        raise TableSchemaError(f"{path}: columns {sorted(unknown)} are not in the {name} schema")
    return [{n: r.get(n) for n in schema.names} for r in rows]


def part_files(directory: str | Path) -> list[Path]:
    """Every part of a table: top-level parts and those of its ``run=<id>`` partitions, in write order."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    files = [*directory.glob("*.parquet"), *directory.glob("run=*/*.parquet")]
    files = [p for p in files if not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.name, str(p)))


def read_table(directory: str | Path, name: str) -> pa.Table:
    """Every row of a table directory (each key once, first written wins), schema checked and upgraded."""
    return ParquetTable(directory, SCHEMAS[name]).to_arrow()


# --- writing -----------------------------------------------------------------------------------------
def _stamp() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")


def _write_arrow(table: pa.Table, folder: Path) -> Path:
    """One part, atomically: a temporary name in the same folder, then a rename."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{_stamp()}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = folder / f".{path.name}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def _write_ray(table: pa.Table, folder: Path) -> Path:
    """One part through Ray Data (the cluster's writers; any filesystem pyarrow reaches)."""
    import ray.data
    from ray.data.datasource import FilenameProvider

    stamp = _stamp()

    class _Names(FilenameProvider):  # part-<time>-<write id>: sorts by time like the arrow writer's
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"part-{stamp}-{write_uuid}-{task_index:04d}.parquet"

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ray.data.from_arrow(table).write_parquet(str(folder), filename_provider=_Names())
    return folder


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


WRITERS = ("auto", "ray", "arrow")


def recording_folders(recording: str | Path | Sequence[str | Path]) -> tuple[Path, ...]:
    """The folders of one recording (a path) or of several replayed together (a sequence), in order.

    >>> recording_folders("datasets/h200_suite")
    (PosixPath('datasets/h200_suite'),)
    """
    if isinstance(recording, str | Path):
        return (Path(recording),)
    return tuple(Path(r) for r in recording)


class ParquetTable:
    """A keyed table stored as Parquet part files in one directory (see the module docstring).

    Args:
        directory: where the parts live (created on first flush); ``None``: in memory only.
        schema: the Arrow schema every row follows; one of ``SCHEMAS`` (it names the table on disk).
        flush_every: rows buffered before a part is written (small: a crash loses at most these).
        run_id: new parts go to ``directory/run=<run_id>/`` (the run partition); ``None``: the top.
        writer: ``"auto"`` (Ray Data inside a running Ray cluster, else pyarrow), ``"ray"``, ``"arrow"``.
        keep: on a key written twice, keep the ``"first"`` record (results: computed once, never
            replaced) or the ``"last"`` (a cache refreshed by re-measuring).
        read_from: the directories read, in order (default: ``directory``); with ``directory=None`` a
            read-only union of them (nothing is ever written to a ``read_from`` directory that is not
            ``directory``).

    Rows are visible to ``get``/``in`` as soon as they are appended (buffered or not). Appends are
    thread-safe.
    """

    def __init__(
        self,
        directory: str | Path | None,
        schema: pa.Schema,
        flush_every: int = 8,
        run_id: str | None = None,
        writer: str = "auto",
        keep: str = "first",
        read_from: Sequence[str | Path] | None = None,
    ):
        names = [n for n, s in SCHEMAS.items() if s.equals(schema)]
        if not names:
            raise ValueError(f"unknown table schema; expected one of {sorted(SCHEMAS)}")
        if writer not in WRITERS:
            raise ValueError(f"writer: expected one of {WRITERS}, got {writer!r}")
        if keep not in ("first", "last"):
            raise ValueError(f"keep: expected 'first' or 'last', got {keep!r}")
        self.keep = keep
        self.name = names[0]
        self._lock = threading.RLock()
        self.directory = Path(directory) if directory is not None else None
        if read_from is None:
            read_from = () if self.directory is None else (self.directory,)
        self.read_from: tuple[Path, ...] = tuple(Path(d) for d in read_from)
        self._source: dict[str, int] = {}  # key -> index in read_from of the directory it came from
        self.schema = schema.with_metadata({SCHEMA_KEY: _schema_tag(self.name)})
        self.flush_every = max(1, int(flush_every))
        self.run_id = run_id
        self.writer = writer
        self._rows: dict[str, dict[str, Any]] = {}
        self._pending: list[dict[str, Any]] = []
        self.duplicates_seen = 0
        self.reload()

    def reload(self) -> None:
        """Re-read every part on disk (pending rows stay pending)."""
        with self._lock:
            self._rows = {}
            self._source = {}
            self.duplicates_seen = 0
            for index, folder in enumerate(self.read_from):
                for part in part_files(folder):
                    try:
                        rows = _read_part(part, self.name, self.schema)
                    except TableSchemaError:
                        raise
                    except Exception as exc:  # a torn part (a killed writer's) must not poison the rest
                        logger.warning("skipping unreadable part %s: %s", part, exc)
                        continue
                    for row in rows:
                        if self._put(row):
                            self._source[row["key"]] = index
            for row in self._pending:
                self._rows.setdefault(row["key"], row)

    def _put(self, row: dict[str, Any]) -> bool:
        """Hold ``row`` under its key by the ``keep`` rule; False when the key was held already."""
        key = row["key"]
        if key in self._rows:
            self.duplicates_seen += 1
            if self.keep == "first":
                return False
            del self._rows[key]  # re-inserted last: records() stays in write order
        self._rows[key] = row
        return True

    def _coerce(self, row: dict[str, Any]) -> dict[str, Any]:
        unknown = set(row) - set(self.schema.names)
        if unknown:
            raise ValueError(
                f"row has columns not in the {self.name} schema: {sorted(unknown)}; "
                f"expected a subset of {self.schema.names}"
            )
        out = {name: row.get(name) for name in self.schema.names}
        if "created_at" in out and out["created_at"] is None:
            out["created_at"] = _dt.datetime.now(_dt.UTC).replace(microsecond=0)
        if not out.get("key"):
            raise ValueError(f"a row needs a non-empty 'key'; got {out.get('key')!r}")
        return out

    def __contains__(self, key: str) -> bool:
        return key in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records())

    def get(self, key: str) -> dict[str, Any] | None:
        """The record with that key, or None."""
        return self._rows.get(key)

    def source_of(self, key: str) -> Path | None:
        """The ``read_from`` directory the record of ``key`` was read from (None: appended, or absent)."""
        index = self._source.get(key)
        return None if index is None else self.read_from[index]

    def rows_per_source(self) -> dict[Path, int]:
        """Records held from each ``read_from`` directory (each key counted once, where it was read)."""
        counts = dict.fromkeys(self.read_from, 0)
        for index in self._source.values():
            counts[self.read_from[index]] += 1
        return counts

    def records(self) -> list[dict[str, Any]]:
        """Every record, each key once, in write order."""
        with self._lock:
            return list(self._rows.values())

    rows = records

    def append(self, row: dict[str, Any]) -> bool:
        """Add one record; a key already present is ignored (returns False). Flushes every ``flush_every``."""
        row = self._coerce(row)
        with self._lock:
            if row["key"] in self._rows and self.keep == "first":
                return False
            self._put(row)
            self._pending.append(row)
            if len(self._pending) >= self.flush_every:
                self.flush()
            return True

    def extend(self, rows: Iterable[dict[str, Any]]) -> int:
        """Append many records; returns how many were new."""
        with self._lock:
            return sum(self.append(r) for r in rows)

    def flush(self) -> None:
        """Write pending records as one new part (nothing for an in-memory table)."""
        with self._lock:
            if not self._pending or self.directory is None:
                self._pending = []
                return
            table = pa.Table.from_pylist(self._pending, schema=self.schema)
            folder = self.directory / f"run={self.run_id}" if self.run_id else self.directory
            use_ray = self.writer == "ray" or (self.writer == "auto" and _ray_running())
            (_write_ray if use_ray else _write_arrow)(table, folder)
            logger.debug("wrote %d %s rows to %s", len(self._pending), self.name, folder)
            self._pending = []

    def dedupe(self) -> Path | None:
        """Flush, then rewrite the directory as one part with every key exactly once.

        The merged part is written (atomically) before the old parts are removed, and its name sorts
        first, so a crash in between leaves duplicates that readers resolve the same way.
        """
        if self.read_from != ((self.directory,) if self.directory is not None else ()):
            raise ValueError(f"dedupe rewrites the one directory a table reads; this reads {self.read_from}")
        self.flush()
        self.reload()
        if self.directory is None or not self._rows:
            return None
        old = part_files(self.directory)
        path = self.directory / f"part-00000000T000000000000-merged-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.directory / f".{path.name}.tmp"
        pq.write_table(self.to_arrow(), tmp)
        os.replace(tmp, path)
        for f in old:
            f.unlink()
        for folder in sorted({f.parent for f in old} - {self.directory}, reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        self.duplicates_seen = 0
        return path

    def to_arrow(self) -> pa.Table:
        """All records (each key once) as an Arrow table with the schema."""
        return pa.Table.from_pylist(self.records(), schema=self.schema)

    def close(self) -> None:
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RewardTable(ParquetTable):
    """The reward table: ``RewardRow``s keyed by their cell (``rewards.cell_key``).

    ``get``/``rows`` return ``RewardRow`` objects; ``append`` takes one (or a record dict).
    """

    def __init__(
        self,
        directory: str | Path | None,
        flush_every: int = 8,
        run_id: str | None = None,
        writer: str = "auto",
        read_from: Sequence[str | Path] | None = None,
    ):
        self._typed: dict[str, Any] = {}
        super().__init__(directory, REWARD_SCHEMA, flush_every, run_id, writer, read_from=read_from)

    def reload(self) -> None:
        with self._lock:
            self._typed = {}
            super().reload()

    def get(self, key: str):
        from autoprofiler.cells import RewardRow

        with self._lock:
            row = self._typed.get(key)
            if row is None and key in self._rows:
                row = self._typed[key] = RewardRow.from_record(self._rows[key])
            return row

    def rows(self) -> list:
        return [self.get(k) for k in list(self._rows)]

    def append(self, row) -> bool:
        record = row if isinstance(row, dict) else row.to_record()
        return super().append(record)


class ProfileTable(ParquetTable):
    """Recorded profiles: records of ``PROFILE_SCHEMA``, one per (task, source, group, environment)."""

    def __init__(
        self,
        directory: str | Path | None,
        flush_every: int = 8,
        run_id: str | None = None,
        writer: str = "auto",
        keep: str = "first",
        read_from: Sequence[str | Path] | None = None,
    ):
        self._by_task: dict[str, list[dict[str, Any]]] = {}
        super().__init__(directory, PROFILE_SCHEMA, flush_every, run_id, writer, keep, read_from)

    def reload(self) -> None:
        with self._lock:
            super().reload()
            self._by_task = {}
            for r in self._rows.values():
                self._by_task.setdefault(r["task_hash"], []).append(r)

    def append(self, row: dict[str, Any]) -> bool:
        with self._lock:
            added = super().append(row)
            if added:
                held = self._rows[row["key"]]
                mine = [r for r in self._by_task.get(held["task_hash"], []) if r["key"] != held["key"]]
                self._by_task[held["task_hash"]] = [*mine, held]
            return added

    def groups_for(self, task_hash: str, source: str | None = None) -> dict[str, dict[str, Any]]:
        """``{group: record}`` recorded for a task (optionally of one source); the first of each group."""
        out: dict[str, dict[str, Any]] = {}
        for r in self._by_task.get(task_hash, ()):
            if source is None or r["source"] == source:
                out.setdefault(r["group"], r)
        return out

    def task_hashes(self) -> set[str]:
        return set(self._by_task)


def dumps(obj: Any) -> str:
    """Deterministic compact JSON (sorted keys; NaN/inf kept as JSON extensions Python reads back)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# --- compaction ---------------------------------------------------------------------------------------
#: a recording's table folders and the schema each holds
RECORDING_TABLES = {"profiles": "profile", "rewards": "reward", "candidates": "candidate"}


@dataclass(frozen=True)
class Compaction:
    """What ``compact_runs`` did to one table directory: parts and bytes before and after."""

    directory: Path
    parts_before: int
    parts_after: int
    bytes_before: int
    bytes_after: int
    skipped: tuple[str, ...] = ()  # run folders left as they were, each with the reason
    copies_dropped: int = 0  # rows identical to an earlier row of their run (see ``compact_runs``)


def compact_runs(directory: str | Path, name: str) -> Compaction:
    """Rewrite each ``run=<id>`` partition of a table directory as one part; every row kept.

    A recording grows by small parts (one per ``flush_every`` rows), so a table of thousands of tasks
    becomes thousands of files, each with its own footer and dictionaries. Unlike ``dedupe``, this keeps
    every row, duplicates included (a key measured in two runs stays measured twice: the repeat-measurement
    study reads both), and it keeps the write order: a run's parts become one part under the name of its
    first part, so it sorts where they did. That holds only when no two runs' parts interleave in time:
    runs that do are left as they are, as is a run with a part that does not read. The merged part is written
    under a temporary name, read back, and renamed over the first part before the others are removed: a
    crash in between leaves rows twice, in order, which readers resolve as before, and the next compaction
    drops such copies (a row identical in every column, ``created_at`` included, to an earlier row of its
    run: a recorder writes a key at most once per run, or rewrites it with a new measurement).
    """
    directory, schema = Path(directory), SCHEMAS[name]
    schema = schema.with_metadata({SCHEMA_KEY: _schema_tag(name)})
    before = part_files(directory)  # in write order, so each run's parts are too
    size_before = sum(p.stat().st_size for p in before)
    runs: dict[Path, list[Path]] = {}
    for part in before:
        if part.parent != directory:
            runs.setdefault(part.parent, []).append(part)
    spans = [(parts[0].name, parts[-1].name, run) for run, parts in runs.items()]
    spans += [(p.name, p.name, p) for p in before if p.parent == directory]  # top-level parts
    interleaved = {
        run for first, last, run in spans for a, b, other in spans if other != run and a < last and first < b
    }
    interleaved &= set(runs)
    skipped = [f"{run.name}: its parts interleave with another run's" for run in sorted(interleaved)]
    copies = 0
    for run, parts in runs.items():
        if run in interleaved or len(parts) == 1:
            continue
        try:
            rows = [row for part in parts for row in _read_part(part, name, schema)]
        except Exception as exc:  # a torn part: leave the run for a person to look at
            skipped.append(f"{run.name}: {exc}")
            continue
        unique, seen = [], set()
        for row in rows:  # a copy (every column the same) is what a stopped compaction left
            text = repr(row)
            if text not in seen:
                seen.add(text)
                unique.append(row)
        copies += len(rows) - len(unique)
        rows = unique
        tmp = run / f".{parts[0].name}.tmp"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
        if pq.ParquetFile(tmp).metadata.num_rows != len(rows):  # read back before anything is replaced
            tmp.unlink()
            skipped.append(f"{run.name}: the merged part did not read back with its {len(rows)} rows")
            continue
        os.replace(tmp, parts[0])
        for part in parts[1:]:
            part.unlink()
    after = part_files(directory)
    size_after = sum(p.stat().st_size for p in after)
    return Compaction(directory, len(before), len(after), size_before, size_after, tuple(skipped), copies)
