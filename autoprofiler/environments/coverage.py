"""Which tasks a replay answers in full: every profile group recorded, and every action's reward row.

A policy routes a task to some groups and a rule-based rewriter picks one of its actions from what those
groups show, so judging policies on a recording is fair only on tasks for which the recording answers
every such choice: tasks that hold every profile group any of the recorded tasks holds and, for a rule
rewriter (``ActionRewriter``), the reward row of each of its actions (each seed). Any other task would
make a policy's answer depend on what happens to be recorded (a missing action row stops the learner,
``MissingOutcome``, and counts as a wrong answer when judging), so a replay leaves it out, up front.

``task_coverage`` sorts tasks into those used and those left out (with why), and attributes each task to
the recording it comes from (the first one listed that holds a row of it, when several are replayed
together); ``Coverage.lines`` says it in one line per recording.

Example::

    env = ReplayEnvironment(["datasets/h200_suite", "datasets/recorded/h200"], RuleRewriter(), "ncu")
    cov = env.coverage(tasks)
    len(cov.used), cov.lines()[0]  # e.g. (36, 'datasets/h200_suite: 32 of 45 recorded tasks used, 13 left
                                   #   out (not every group profiled: 13)')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoprofiler.cells import Cell

if TYPE_CHECKING:
    from autoprofiler.environments.profiles import RecordedProfiler
    from autoprofiler.rewriters.base import ActionRewriter
    from autoprofiler.tables import ParquetTable, ProfileTable, RewardTable
    from autoprofiler.tasks import Task

__all__ = ["Coverage", "recorded_hashes", "task_coverage"]


@dataclass(frozen=True)
class Coverage:
    """What a replay answers for a list of tasks (see the module docstring).

    Attributes:
        used: the tasks with every group and every action's row, in the given order.
        groups: the groups every used task holds (every group any recorded task holds).
        actions: the rewriter's actions every used task has a row for (``()``: not rule-based).
        lacking_groups: task id -> the groups it lacks (a recorded task left out for that).
        lacking_actions: task id -> the actions with no reward row (a task with every group).
        unrecorded: ids of the tasks no recording holds a row of.
        home: task id -> the recording its rows come from (the first listed holding one), recorded tasks.
        recorded: recording -> how many distinct tasks it holds rows of (selected or not).
    """

    used: tuple[Task, ...]
    groups: tuple[str, ...]
    actions: tuple[str, ...]
    lacking_groups: dict[str, tuple[str, ...]]
    lacking_actions: dict[str, tuple[str, ...]]
    unrecorded: tuple[str, ...]
    home: dict[str, Path]
    recorded: dict[Path, int]

    def reasons(self) -> dict[str, list[str]]:
        """Task id -> why the task is left out, for every recorded task not used: the groups it lacks,
        then ``action <name>`` for each action without a row."""
        out: dict[str, list[str]] = {i: list(g) for i, g in self.lacking_groups.items()}
        for task_id, actions in self.lacking_actions.items():
            out.setdefault(task_id, []).extend(f"action {a}" for a in actions)
        return out

    def left_out(self) -> dict[str, dict[str, object]]:
        """Task id -> its recording and what it lacks (``groups``, ``actions``), for every recorded task not
        used (a run's ``tasks_left_out.json``)."""
        ids = [i for i in self.home if i in self.lacking_groups or i in self.lacking_actions]
        return {
            i: {
                "recording": str(self.home[i]),
                "groups": list(self.lacking_groups.get(i, ())),
                "actions": list(self.lacking_actions.get(i, ())),
            }
            for i in ids
        }

    def used_per_recording(self) -> dict[Path, int]:
        """Recording -> how many used tasks come from it (every recording listed, 0 included)."""
        counts = Counter(self.home[t.id] for t in self.used)
        return {rec: counts.get(rec, 0) for rec in self.recorded}

    def lines(self) -> list[str]:
        """One line per recording: of the selected tasks it holds, how many are used, how many left out
        and why (a task lacking several actions is counted under each), and how many of its tasks were
        not selected at all."""
        selected = Counter(self.home.values())
        used = self.used_per_recording()
        no_groups = Counter(self.home[i] for i in self.lacking_groups)
        no_action: dict[Path, Counter] = {}
        for task_id, actions in self.lacking_actions.items():
            no_action.setdefault(self.home[task_id], Counter()).update(actions)
        out = []
        for rec, held in self.recorded.items():
            n, left = selected.get(rec, 0), selected.get(rec, 0) - used[rec]
            line = f"{rec}: {used[rec]} of {n} recorded tasks used"
            if left:
                why = [f"not every group profiled: {no_groups[rec]}"] if no_groups.get(rec) else []
                why += [
                    f"no row for action {a}: {k}" for a, k in sorted(no_action.get(rec, Counter()).items())
                ]
                line += f", {left} left out ({'; '.join(why)})"
            if held > n:
                line += f"; {held - n} of its {held} tasks are not among the selected tasks"
            out.append(line)
        return out


def recorded_hashes(tables: Sequence[ParquetTable], recordings: Sequence[Path]) -> dict[Path, set[str]]:
    """Recording -> the task hashes its tables hold a row of (``tables`` read ``<recording>/<table>``)."""
    out: dict[Path, set[str]] = {rec: set() for rec in recordings}
    for table in tables:
        for record in table.records():
            where = table.source_of(record["key"])
            if where is not None and where.parent in out:
                out[where.parent].add(record["task_hash"])
    return out


def task_coverage(
    tasks: Sequence[Task],
    recordings: Sequence[Path],
    profiler: RecordedProfiler,
    profiles: ProfileTable,
    rewards: RewardTable,
    rule: ActionRewriter | None,
    seeds: Sequence[int] = (0,),
) -> Coverage:
    """Sort ``tasks`` by what ``recordings`` answer (see the module docstring).

    ``profiles``/``rewards`` read ``<recording>/profiles`` and ``<recording>/rewards`` of each recording
    (``ParquetTable.read_from``); ``profiler`` answers groups of the replayed source from ``profiles``;
    ``rule``: the rule rewriter whose actions must each have a row (None: only groups are required).
    """
    held = recorded_hashes([profiles, rewards], recordings)
    home: dict[str, Path] = {}
    for t in tasks:
        where = next((rec for rec in recordings if t.hash in held[rec]), None)
        if where is not None:
            home[t.id] = where
    recorded = [t for t in tasks if t.id in home]
    have = {t.id: profiler.recorded_groups(t) for t in recorded}
    groups = set().union(*have.values()) if have else set()
    lacking_groups = {t.id: tuple(sorted(groups - have[t.id])) for t in recorded if groups - have[t.id]}
    actions = tuple(rule.actions()) if rule is not None else ()
    lacking_actions: dict[str, tuple[str, ...]] = {}
    for t in recorded:
        if t.id in lacking_groups or rule is None:
            continue
        keys = {
            a: [Cell(t, (), rule.actions_identity, s, 0, a, policy="action").key for s in seeds]
            for a in actions
        }
        missing = tuple(a for a in actions if any(k not in rewards for k in keys[a]))
        if missing:
            lacking_actions[t.id] = missing
    used = tuple(t for t in recorded if t.id not in lacking_groups and t.id not in lacking_actions)
    return Coverage(
        used=used,
        groups=tuple(sorted(groups)),
        actions=actions,
        lacking_groups=lacking_groups,
        lacking_actions=lacking_actions,
        unrecorded=tuple(t.id for t in tasks if t.id not in home),
        home=home,
        recorded={rec: len(hashes) for rec, hashes in held.items()},
    )
