"""Profiles answered from a profile table, the way ``Profiler.collect`` answers them from the GPU.

``RecordedProfiler`` is what policies call ``collect(task, groups)`` on inside an environment: in a
replay, from the recording; in a live run, from the run's own table, which the environment fills by
profiling on its workers first (``fetch``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from autoprofiler.profiling.cache import profile_from_record
from autoprofiler.tables import ProfileTable

if TYPE_CHECKING:
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.tasks import Task

__all__ = ["MissingProfile", "RecordedProfiler"]


class MissingProfile(LookupError):
    """The table holds no profile for a (task, group) that was asked for."""


class RecordedProfiler:
    """Answers ``collect(task, groups)`` from a ``ProfileTable``, like ``Profiler`` does from the GPU.

    Collection is cumulative per task, as with ``Profiler``: the returned profile holds every group
    collected so far for the task, and ``passes``/``seconds`` are the recorded cost of the groups new to
    this call. ``reset()`` forgets what was collected (a fresh policy evaluation starts from nothing).

    Args:
        table: the profile table.
        source: answer only rows of this source ("ncu" or "torch"); None takes any.
        fetch: called as ``fetch([task], groups)`` for groups the table lacks, to collect and record
            them (a live environment's workers); None: a missing group is an error.

    Raises:
        MissingProfile: a group the table lacks (after ``fetch``); the message names task and group.
    """

    def __init__(
        self,
        table: ProfileTable,
        source: str | None = None,
        fetch: Callable[[Sequence[Task], Sequence[str]], list[dict[str, str]]] | None = None,
    ):
        self.table = table
        self.source = source
        self.fetch = fetch
        self._collected: dict[str, set[str]] = {}
        self._parsed: dict[tuple[str, str], Profile] = {}

    def reset(self) -> None:
        self._collected.clear()

    def recorded_groups(self, task: Task) -> set[str]:
        return set(self.table.groups_for(task.hash, self.source))

    def _rows(self, task: Task, groups: set[str]) -> dict[str, dict]:
        recorded = self.table.groups_for(task.hash, self.source)
        missing = sorted(groups - set(recorded))
        if missing and self.fetch is not None:
            failures = self.fetch([task], missing)
            recorded = self.table.groups_for(task.hash, self.source)
            missing = sorted(groups - set(recorded))
            if missing and failures:
                raise MissingProfile(
                    f"profiling task {task.id!r} (hash {task.hash}) failed: {failures[0]['error']}"
                )
        if missing:
            have = sorted(recorded)
            raise MissingProfile(
                f"no recorded profile for task {task.id!r} (hash {task.hash}) group(s) {missing}; "
                f"recorded groups for it: {have or 'none'}"
            )
        return recorded

    def _profile(self, task: Task, recorded: dict[str, dict], groups: Iterable[str]) -> Profile | None:
        """The merge of the recorded per-group profiles of ``groups`` (each group's own metrics)."""
        profile = None
        for g in sorted(groups):
            key = (task.hash, g)
            if key not in self._parsed:
                if not recorded[g]["profile_json"]:
                    raise MissingProfile(
                        f"task {task.id!r} (hash {task.hash}) group {g!r} has a cost row but no metrics"
                    )
                self._parsed[key] = profile_from_record(recorded[g])
            part = self._parsed[key]
            profile = part if profile is None else profile.merge(part)
        return profile

    def cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        """Recorded (passes, seconds) of collecting ``groups`` for ``task`` from nothing."""
        groups = set(groups)
        if not groups:
            return 0, 0.0
        recorded = self._rows(task, groups)
        return (
            sum(int(recorded[g]["passes"] or 0) for g in groups),
            sum(float(recorded[g]["seconds"] or 0.0) for g in groups),
        )

    def snapshot(self, task: Task, groups: Iterable[str]) -> Profile | None:
        """The recorded profile restricted to ``groups``, at their standalone cost; no state changes."""
        groups = set(groups)
        if not groups:
            return None
        recorded = self._rows(task, groups)
        passes, seconds = self.cost(task, groups)
        return dataclasses.replace(self._profile(task, recorded, groups), passes=passes, seconds=seconds)

    def collect(self, task: Task, groups: Iterable[str]) -> Profile | None:
        groups = set(groups)
        recorded = self._rows(task, groups)
        seen = self._collected.setdefault(task.hash, set())
        new = groups - seen
        passes = sum(int(recorded[g]["passes"] or 0) for g in new)
        seconds = sum(float(recorded[g]["seconds"] or 0.0) for g in new)
        seen |= groups
        profile = self._profile(task, recorded, seen)
        return None if profile is None else dataclasses.replace(profile, passes=passes, seconds=seconds)
