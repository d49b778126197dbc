"""ProfileCache: a content-addressed Parquet store of collected metric groups.

Key: (task hash, group, device name, driver version, tool version) where the tool is ncu (its version)
or torch (its version) for the torch source. One row per (key) holds that group's task-level metrics,
its per-kernel table and units (JSON strings), and the cost of the run that collected it. The store is a
directory of append-only Parquet files (``part-<time in ns>-<uuid>.parquet``, written to a temporary name
then renamed); opening it loads every part; a later row for the same key wins. Many processes may
append to one directory; each sees the others' rows after reopening.

Example:
    >>> import tempfile
    >>> from autoprofiler.profiling.profile import Profile
    >>> cache = ProfileCache(tempfile.mkdtemp())
    >>> env = CacheEnvironment(device="NVIDIA H200", driver="580.159", tool="ncu 2025.3.1")
    >>> p = Profile("abc", "ncu", frozenset({"root"}), {"gpu__time_duration.sum": 5.0}, passes=9, seconds=7.0)
    >>> cache.put(p, env)
    >>> ProfileCache(cache.path).get("abc", ["root"], env).metrics
    {'gpu__time_duration.sum': 5.0}
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoprofiler.profiling.profile import Profile

log = logging.getLogger(__name__)

COLUMNS = (
    "key",
    "task_hash",
    "group",
    "source",
    "device",
    "driver",
    "tool",
    "metrics_json",
    "kernels_json",
    "units_json",
    "passes",
    "seconds",
    "created_unix",
)


@dataclass(frozen=True)
class CacheEnvironment:
    """Where a profile was measured: part of every cache key."""

    device: str  # "NVIDIA H200", "cpu"
    driver: str  # "580.159", "" on CPU
    tool: str  # "ncu 2025.3.1.0" or "torch 2.11.0+cu130"


def cache_key(task_hash: str, group: str, env: CacheEnvironment) -> str:
    """sha256 over the key fields, first 32 hex digits."""
    text = "\x1f".join((task_hash, group, env.device, env.driver, env.tool))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class ProfileCache:
    """Parquet-backed store of per-group profiles (see module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._rows: dict[str, dict] = {}
        self.reload()

    def reload(self) -> None:
        """Read every part file (sorted by name, so later parts win)."""
        import pyarrow.parquet as pq

        self._rows.clear()
        for part in sorted(self.path.glob("part-*.parquet")):
            try:
                table = pq.read_table(part)
            except Exception as exc:  # a torn or foreign file must not poison the cache
                log.warning("skipping unreadable cache part %s: %s", part, exc)
                continue
            for row in table.to_pylist():
                self._rows[row["key"]] = row

    def __len__(self) -> int:
        return len(self._rows)

    def get_group(self, task_hash: str, group: str, env: CacheEnvironment) -> Profile | None:
        """The cached profile of one group, or ``None`` (its passes/seconds: the original cost)."""
        row = self._rows.get(cache_key(task_hash, group, env))
        if row is None:
            return None
        return Profile(
            task_hash=row["task_hash"],
            source=row["source"],
            groups=frozenset({row["group"]}),
            metrics=json.loads(row["metrics_json"]),
            kernels=json.loads(row["kernels_json"]),
            passes=int(row["passes"]),
            seconds=float(row["seconds"]),
            device=row["device"],
            units=json.loads(row["units_json"]),
        )

    def created(self, task_hash: str, group: str, env: CacheEnvironment) -> float | None:
        """When the group's row was written (unix seconds), or ``None``."""
        row = self._rows.get(cache_key(task_hash, group, env))
        return None if row is None else float(row["created_unix"])

    def get(self, task_hash: str, groups: Iterable[str], env: CacheEnvironment) -> Profile | None:
        """All of ``groups`` merged, or ``None`` unless every group is cached. Cost fields are zero.

        Parts merge oldest first, so a metric shared by two groups keeps its first measured value (as
        :meth:`Profile.merge` does for a profiler collecting groups one after the other).
        """
        groups = list(groups)
        if any(self.created(task_hash, g, env) is None for g in groups):
            return None
        merged = None
        for group in sorted(groups, key=lambda g: self.created(task_hash, g, env)):
            part = self.get_group(task_hash, group, env)
            merged = part if merged is None else merged.merge(part)
        if merged is not None:
            merged.passes, merged.seconds = 0, 0.0
        return merged

    def put(self, profile: Profile, env: CacheEnvironment) -> None:
        """Append one row per group of ``profile`` (each restricted to that group) in a new part file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = []
        now = time.time()
        for group in sorted(profile.groups):
            part = profile.restrict([group])
            rows.append(
                {
                    "key": cache_key(profile.task_hash, group, env),
                    "task_hash": profile.task_hash,
                    "group": group,
                    "source": profile.source,
                    "device": env.device,
                    "driver": env.driver,
                    "tool": env.tool,
                    "metrics_json": json.dumps(part.metrics, sort_keys=True),
                    "kernels_json": json.dumps(part.kernels),
                    "units_json": json.dumps(part.units, sort_keys=True),
                    "passes": int(profile.passes),
                    "seconds": float(profile.seconds),
                    "created_unix": now,
                }
            )
        if not rows:
            return
        table = pa.Table.from_pylist(rows)
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.parquet"  # sorts by write time
        tmp = self.path / f".{name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.path / name)
        for row in rows:
            self._rows[row["key"]] = row
