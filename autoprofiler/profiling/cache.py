"""ProfileCache: the profiler's content-addressed store of collected metric groups.

Key: (task hash, source, group, device name, driver version, tool version), where the tool is ncu (its
version) or torch (its version) for the torch source. Rows are those of every recorded profile
(``autoprofiler.tables.ProfileTable``, the same writer and schema): one per group, holding that group's
task-level metrics, per-kernel table and units, and the cost of the run that collected it. A later row
for the same key wins (a re-measurement refreshes the cache). Many processes may append to one
directory; each sees the others' rows after reopening.

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

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoprofiler.profiling.groups import GROUPS
from autoprofiler.profiling.profile import Profile
from autoprofiler.tables import ProfileTable, dumps, profile_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheEnvironment:
    """Where a profile was measured: part of every cache key."""

    device: str  # "NVIDIA H200", "cpu"
    driver: str  # "580.159", "" on CPU
    tool: str  # "ncu 2025.3.1.0" or "torch 2.11.0+cu130"


def _source(group: str) -> str:
    spec = GROUPS.get(group)
    return spec.source if spec is not None else ("torch" if group.startswith("torch_") else "ncu")


def cache_key(task_hash: str, group: str, env: CacheEnvironment) -> str:
    """The profile-table key of one group measured in ``env``."""
    return profile_key(task_hash, _source(group), group, env.device, env.driver, env.tool)


def profile_record(profile: Profile, group: str, env: CacheEnvironment, **extra) -> dict:
    """The profile-table record of one group of ``profile`` (restricted to it; the run's cost)."""
    return {
        "key": cache_key(profile.task_hash, group, env),
        "task_hash": profile.task_hash,
        "source": profile.source,
        "group": group,
        "passes": int(profile.passes or 0),
        "seconds": float(profile.seconds or 0.0),
        "profile_json": dumps(profile.restrict([group]).to_dict()),
        "device": env.device,
        "driver": env.driver,
        "ncu_version": env.tool,
        **extra,
    }


def profile_from_record(record: dict) -> Profile:
    """The ``Profile`` a profile-table record holds (its ``passes``/``seconds``: the recorded cost)."""
    profile = Profile.from_dict(json.loads(record["profile_json"]))
    profile.passes, profile.seconds = int(record["passes"] or 0), float(record["seconds"] or 0.0)
    return profile


class ProfileCache:
    """The profiler's store of per-group profiles (see the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.table = ProfileTable(self.path, flush_every=1, writer="arrow", keep="last")

    def reload(self) -> None:
        self.table.reload()

    def __len__(self) -> int:
        return len(self.table)

    def get_group(self, task_hash: str, group: str, env: CacheEnvironment) -> Profile | None:
        """The cached profile of one group, or ``None`` (its passes/seconds: the original cost)."""
        record = self.table.get(cache_key(task_hash, group, env))
        return None if record is None else profile_from_record(record)

    def get(self, task_hash: str, groups: Iterable[str], env: CacheEnvironment) -> Profile | None:
        """All of ``groups`` merged, or ``None`` unless every group is cached. Cost fields are zero.

        Groups merge in the order they were written, so a metric shared by two groups keeps its first
        measured value (as :meth:`Profile.merge` does for a profiler collecting groups one by one).
        """
        keys = {cache_key(task_hash, g, env) for g in groups}
        found = [r for r in self.table.records() if r["key"] in keys]
        if len(found) < len(keys):
            return None
        merged = None
        for record in found:
            part = profile_from_record(record)
            merged = part if merged is None else merged.merge(part)
        if merged is not None:
            merged.passes, merged.seconds = 0, 0.0
        return merged

    def cached_groups(self, task_hash: str, groups: Iterable[str], env: CacheEnvironment) -> list[str]:
        """Those of ``groups`` in the cache, in the order they were written."""
        order = {r["key"]: i for i, r in enumerate(self.table.records())}
        hits = [g for g in groups if cache_key(task_hash, g, env) in order]
        return sorted(hits, key=lambda g: order[cache_key(task_hash, g, env)])

    def put(self, profile: Profile, env: CacheEnvironment) -> None:
        """Append one record per group of ``profile`` (each restricted to that group), as one part."""
        with self.table._lock:
            self.table.flush_every = max(1, len(profile.groups))
            for group in sorted(profile.groups):
                self.table.append(profile_record(profile, group, env))
            self.table.flush()
