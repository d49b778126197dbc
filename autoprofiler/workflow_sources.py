"""The tasks and recordings a workflow config names: one path or a list of paths each.

- ``resolve_path``: a relative path in a config means the current folder's, else the repository's.
- ``path_list`` / ``path_spec_problem``: ``tables`` and ``tasks`` take a path or a list of paths
  (``tasks='[datasets/suite, datasets/ops_gen/tasks.parquet]'``); anything else is a config problem.
- ``select_tasks`` / ``checked_tasks`` / ``task_problems``: the tasks of every source named, merged by
  id, filtered and capped. A task id two sources both hold is one task when its content (task hash) is
  the same in both; with different content it is a config problem, and so is one content under two ids
  in two sources (it would be judged twice, and could land on both sides of the train/held-out split).
  A path that does not load is a problem naming it.
- ``recording_problems`` / ``tables_problems``: each ``tables`` folder of a replay must be a recording
  (``rewards/`` and ``profiles/``); a live run writes one.
- ``replay_tasks`` (``coverage_lines``, ``replay_sources``): the tasks a replay uses, and what it used per
  recording and per task source: one line each for the log, a record for ``evaluation.json``.

Everything here raises or returns problems; the scripts print.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoprofiler.tasks import LoadReport, TaskLoadError, load_tasks

if TYPE_CHECKING:
    from autoprofiler.environments import ReplayEnvironment
    from autoprofiler.environments.coverage import Coverage
    from autoprofiler.tasks import Task

__all__ = [
    "REPO",
    "SourcedReport",
    "TaskConflict",
    "checked_tasks",
    "coverage_lines",
    "is_recording",
    "load_task_sources",
    "path_list",
    "path_spec_problem",
    "recording_problems",
    "replay_sources",
    "replay_tasks",
    "resolve_path",
    "select_tasks",
    "tables_problems",
    "task_problems",
]

#: The repository root (``datasets/``, ``trees/``, ``workflows/``).
REPO = Path(__file__).resolve().parents[1]
#: Conflicting ids named in a ``TaskConflict`` message before "and N more".
SHOWN_CONFLICTS = 3


def resolve_path(spec: str | Path) -> Path:
    """A path named in a config: absolute as given; relative: under the current folder when it is there,
    else under the repository root (a script run from another folder still finds ``datasets/suite``),
    else under the current folder (an output that does not exist yet)."""
    path = Path(spec)
    if path.is_absolute() or path.exists():
        return path
    return REPO / path if (REPO / path).exists() else path


def path_list(spec: str | Path | Sequence[str | Path] | None) -> list[str]:
    """The paths of a ``tables``/``tasks`` value: ``[]`` for null, one for a path, the list as given.

    >>> path_list("datasets/suite"), path_list(["a", "b"]), path_list(None)
    (['datasets/suite'], ['a', 'b'], [])
    """
    if spec is None:
        return []
    if isinstance(spec, str | Path):
        return [str(spec)]
    return [str(s) for s in spec]


def path_spec_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` as a path or a list of paths (None: nothing; null is the caller's)."""
    if value is None or (isinstance(value, str) and value) or isinstance(value, Path):
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        if len(set(value)) < len(value):
            return f"{key}: {value!r} names a path twice"
        return None
    return f"{key}: expected a path or a non-empty list of paths, got {value!r} ({type(value).__name__})"


class TaskConflict(ValueError):
    """Two task sources disagree: one id with two contents, or one content under two ids."""


@dataclass
class SourcedReport(LoadReport):
    """A ``LoadReport`` of the tasks of one or more sources, merged; ``source_of``: task id -> the
    source (as named in the config) it was loaded from (the first, for an id two sources share)."""

    source_of: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def per_source(self, tasks: Sequence[Task]) -> dict[str, int]:
        """Source -> how many of ``tasks`` come from it (every source listed, 0 included)."""
        counts = Counter(self.source_of.get(t.id, "") for t in tasks)
        return {s: counts.get(s, 0) for s in self.sources}


def load_task_sources(specs: Sequence[str | Path]) -> SourcedReport:
    """The tasks of every source in ``specs`` (anything ``tasks.load_tasks`` reads), merged by id.

    Raises:
        TaskLoadError: a source that does not load (the first; ``checked_tasks`` reports each).
        TaskConflict: an id with different content in two sources, or one content under two ids.
    """
    merged = SourcedReport(sources=[str(s) for s in specs])
    by_hash: dict[str, tuple[str, str]] = {}  # task hash -> (id, source), across sources
    twice_id: list[str] = []
    twice_hash: list[str] = []
    for spec in merged.sources:
        report = load_tasks(resolve_path(spec))
        merged.errors.extend(report.errors)
        for task in report.tasks:
            held = merged.source_of.get(task.id)
            if held is not None:
                first = next(t for t in merged.tasks if t.id == task.id)
                if first.hash != task.hash:
                    twice_id.append(f"{task.id!r} ({held}: {first.hash}, {spec}: {task.hash})")
                continue
            other = by_hash.get(task.hash)
            if other is not None and other[1] != spec:
                twice_hash.append(f"{task.id!r} in {spec} and {other[0]!r} in {other[1]} ({task.hash})")
                continue
            by_hash.setdefault(task.hash, (task.id, spec))
            merged.tasks.append(task)
            merged.source_of[task.id] = spec
    problems = []
    if twice_id:
        problems.append(
            f"{len(twice_id)} task id(s) name different content in two sources (task hash differs): "
            + _some(twice_id)
        )
    if twice_hash:
        problems.append(
            f"{len(twice_hash)} task(s) have the same content under two ids in two sources: "
            + _some(twice_hash)
        )
    if problems:
        raise TaskConflict("; ".join(problems) + "; name each task once")
    return merged


def _some(items: Sequence[str]) -> str:
    more = len(items) - SHOWN_CONFLICTS
    return ", ".join(items[:SHOWN_CONFLICTS]) + (f" and {more} more" if more > 0 else "")


def select_tasks(
    spec: str | Path | Sequence[str | Path], names: Sequence[str] = (), max_tasks: int = 0
) -> tuple[list[Task], SourcedReport, list[str]]:
    """The tasks ``spec`` holds (a source, or a list of sources merged by id), filtered and capped.

    ``names``: task ids or id suffixes (``relu``, ``l1/relu``, ``suite/l1/relu``), kept in the order
    of ``spec``; empty keeps every task. ``max_tasks`` > 0 keeps the first that many after the filter.
    Returns ``(tasks, load report, names that matched no task)``.

    Raises:
        tasks.TaskLoadError: a source does not exist or is not a task source.
        TaskConflict: two sources disagree about a task (``load_task_sources``).
    """
    report = load_task_sources(path_list(spec))
    wanted = [str(n) for n in names]

    def matches(task_id: str, name: str) -> bool:
        return task_id == name or task_id.endswith("/" + name)

    tasks = [t for t in report.tasks if not wanted or any(matches(t.id, n) for n in wanted)]
    unmatched = [n for n in wanted if not any(matches(t.id, n) for t in report.tasks)]
    return (tasks[:max_tasks] if max_tasks else tasks), report, unmatched


def checked_tasks(
    spec: Any, names: Any, max_tasks: Any, key: str = "tasks", filter_key: str = "filter"
) -> tuple[list[Task] | None, list[str]]:
    """``(the selected tasks, one line per problem)``: a source that does not load (each named), two
    sources that disagree, names matching no task, none left. The tasks are None when they could not be
    selected; values of a wrong type (already reported by ``load_config``) select nothing, silently."""
    if path_spec_problem(key, spec) or spec is None or not isinstance(names, list):
        return None, []
    if not isinstance(max_tasks, int):
        return None, []
    problems = [
        f"{key}: {one!r} does not load: {one}: no such file or folder"
        for one in path_list(spec)
        if not resolve_path(one).exists()
    ]
    if problems:
        return None, problems
    try:
        tasks, report, unmatched = select_tasks(spec, names, max_tasks)
    except TaskLoadError as exc:
        return None, [f"{key}: {exc.path!r} does not load: {' '.join(str(exc).split())}"]
    except TaskConflict as exc:
        return None, [f"{key}: {exc}"]
    shown = spec if isinstance(spec, str) else ", ".join(path_list(spec))
    problems = [f"{filter_key}: {n!r} matches no task in {shown}" for n in unmatched]
    if not tasks and not unmatched:
        problems.append(f"{key}: {shown!r} selects 0 tasks ({len(report.errors)} failed to load)")
    return tasks, problems


def task_problems(
    spec: Any, names: Any, max_tasks: Any, key: str = "tasks", filter_key: str = "filter"
) -> list[str]:
    """One line per problem with the tasks a config names (``checked_tasks``'s problems)."""
    return checked_tasks(spec, names, max_tasks, key, filter_key)[1]


def recording_problems(spec: Any, key: str = "tables") -> list[str]:
    """One line per ``tables`` folder that is not a recording (missing, or without ``rewards/`` and
    ``profiles/``); a value of a wrong type (reported by ``load_config``) gives none."""
    if path_spec_problem(key, spec) or spec is None:
        return []
    problems = []
    for one in path_list(spec):
        folder = resolve_path(one)
        if not folder.exists():
            problems.append(f"{key}: {one!r} does not exist")
        elif not all((folder / sub).is_dir() for sub in ("rewards", "profiles")):
            problems.append(f"{key}: {one!r} is not a recording (needs rewards/ and profiles/ folders)")
    return problems


def tables_problems(tables: Any, environment: str) -> list[str]:
    """A workflow's ``tables`` for its ``environment``: a replay needs every folder to be a recording
    (``auto`` too, when it names several), a live run writes one folder (or null: ``out_dir/tables``).
    A value of a wrong type (reported by ``load_config``) gives none."""
    if path_spec_problem("tables", tables):
        return []
    if environment == "replay" and not tables:
        return ["tables: environment=replay needs tables=<a recording folder, or a list of them>"]
    if environment == "replay" or (environment == "auto" and len(path_list(tables)) > 1):
        return recording_problems(tables)
    if environment == "live" and len(path_list(tables)) > 1:
        return ["tables: environment=live writes one recording; give one folder (or null: out_dir/tables)"]
    return []


def is_recording(spec: Any) -> bool:
    """Whether every path of ``spec`` is a recording folder (``environment=auto`` replays then)."""
    paths = path_list(spec) if not path_spec_problem("tables", spec) else []
    return bool(paths) and not recording_problems(spec)


def coverage_lines(coverage: Coverage, report: SourcedReport) -> list[str]:
    """What a replay uses: one line per recording (``Coverage.lines``), and one for the selected tasks no
    recording holds, by task source."""
    lines = coverage.lines()
    if coverage.unrecorded:
        per = Counter(report.source_of.get(i, "") for i in coverage.unrecorded)
        total = len(coverage.unrecorded) + len(coverage.home)
        lines.append(
            f"not recorded: {len(coverage.unrecorded)} of {total} selected tasks have no row in any "
            f"recording ({'; '.join(f'{s}: {per[s]}' for s in report.sources if per.get(s))})"
        )
    return lines


def replay_sources(
    env: ReplayEnvironment, coverage: Coverage, report: SourcedReport, selected: Sequence[Task]
) -> dict[str, Any]:
    """The recordings and task sources a replay used, for ``evaluation.json``: per recording its profile
    and reward rows (those read from it), the tasks it holds and the tasks used from it; per task source
    the tasks ``selected`` (after the filter and cap) and used."""
    rows = env.rows_per_recording()
    used = coverage.used_per_recording()
    recordings = [
        {"path": str(rec), **rows[rec], "tasks_recorded": coverage.recorded[rec], "tasks_used": used[rec]}
        for rec in env.recordings
    ]
    chosen = report.per_source(selected)
    used_tasks = report.per_source(list(coverage.used))
    tasks = [{"path": s, "tasks_selected": chosen[s], "tasks_used": used_tasks[s]} for s in report.sources]
    return {"recordings": recordings, "task_sources": tasks}


def unrecorded_actions_hint(coverage: Coverage) -> str | None:
    """When actions missing from the recordings leave no task usable: the actions none of the tasks
    with every group has a row of, and what to do (None when some task is used, or groups are the
    cause)."""
    if coverage.used or not coverage.lacking_actions:
        return None
    lacking = Counter(a for actions in coverage.lacking_actions.values() for a in actions)
    never = [a for a in coverage.actions if lacking[a] == len(coverage.lacking_actions)]
    none_of = f" (no task has a row of {', '.join(never)})" if never else ""
    return (
        f"no task has a reward row of every action the rewriter can choose{none_of}: record them "
        "(bench/h200_record_playbook.sh records the playbook's) or replay a rewriter whose actions are "
        "recorded (rewriter=rule or rewriter=experience)"
    )


def replay_tasks(
    env: ReplayEnvironment,
    tasks: Sequence[Task],
    report: SourcedReport,
    out: Path,
    seeds: Sequence[int] = (0,),
) -> tuple[list[Task], dict[str, Any]]:
    """The tasks a replay learns and judges on, those the recordings answer in full
    (``ReplayEnvironment.coverage``), and the record of its sources for ``evaluation.json``
    (``replay_sources``). Prints one line per recording (``coverage_lines``) and writes
    ``out/tasks_left_out.json``: why each other recorded task was left out."""
    coverage = env.coverage(tasks, seeds)
    for line in coverage_lines(coverage, report):
        print(f"replay: {line}", flush=True)
    hint = unrecorded_actions_hint(coverage)
    if hint:
        print(f"replay: {hint}", flush=True)
    (out / "tasks_left_out.json").write_text(json.dumps(coverage.left_out(), indent=1) + "\n")
    return list(coverage.used), replay_sources(env, coverage, report, tasks)
