"""Environments: cells in, reward rows out, each computed once.

One class serves replay, live CPU and live GPU; only the runner differs:

- live: a ``LocalDriver`` over a ``CellWorker`` in this process, or a ``RayDriver`` over one
  ``GpuWorker`` actor per GPU; what the workers measure is stored under ``table_dir`` (``rewards/``,
  ``profiles/``, ``candidates/`` Parquet tables, partitioned by run);
- replay: a driver over a ``ReplayWorker`` answering from a recording, or from the union of several
  (``ReplayEnvironment(["datasets/h200_suite", "datasets/recorded/h200"], ...)``); rows derived during
  the replay stay in memory unless a folder is given. ``coverage(tasks)`` says which tasks the
  recordings answer in full (``environments.coverage``).

``outcomes(cells)`` looks each cell up in the reward table by key and sends only the missing ones to
the runner, all at once (that is what the fan-out parallelizes), so nothing is computed twice and a
stopped run resumes where it stopped. For a rule rewriter (``ActionRewriter``) the row of a
configuration depends on the shown profile only through the action the rules pick: the environment
decides that action from the recorded profile and evaluates each (task, action) once, as an action
cell keyed by the rewriter's ``actions_identity``; every configuration's row is derived from it.

Example (replay from a recorded directory)::

    env = ReplayEnvironment.from_dir("datasets/h200_suite", rewriter=RuleRewriter())
    row = env.outcome(task, "memory+speed_of_light")
    row.action, row.speedup                             # ('torch_compile', 1.31)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoprofiler.cells import Cell, CellFailure, RewardRow, WorkItem
from autoprofiler.environments.coverage import Coverage, task_coverage
from autoprofiler.environments.profiles import MissingProfile, RecordedProfiler
from autoprofiler.profiling.cache import CacheEnvironment, profile_record
from autoprofiler.provenance import Provenance
from autoprofiler.rewriters.base import ActionRewriter, Rewriter
from autoprofiler.runtime.driver import LocalDriver, Runner
from autoprofiler.runtime.worker import CellWorker, ReplayWorker
from autoprofiler.tables import CANDIDATE_SCHEMA, ParquetTable, ProfileTable, RewardTable, recording_folders

if TYPE_CHECKING:
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.tasks import Task

__all__ = [
    "CellFailed",
    "EnvStats",
    "Environment",
    "LiveEnvironment",
    "MissingOutcome",
    "ReplayEnvironment",
    "configuration_groups",
    "new_run_id",
]

logger = logging.getLogger(__name__)


class MissingOutcome(LookupError):
    """The recording holds no outcome for the asked cell (task, configuration, rewriter, seed, round)."""


class CellFailed(RuntimeError):
    """A cell that has no row because the machinery failed (its ``failure`` says why)."""

    def __init__(self, failure: CellFailure):
        super().__init__(failure.message)
        self.failure = failure


def raise_failure(failure: CellFailure) -> None:
    """The exception a failure means to a caller of ``Environment.outcomes``."""
    if failure.kind == "missing":
        raise MissingOutcome(failure.message)
    if failure.kind == "missing_profile":
        raise MissingProfile(failure.message)
    raise CellFailed(failure)


def configuration_groups(configuration: str | Iterable[str]) -> tuple[str, ...]:
    """The sorted groups of a configuration name (``"memory+speed_of_light"``) or of a group iterable.

    >>> configuration_groups("stalls+memory")
    ('memory', 'stalls')
    >>> configuration_groups("")
    ()
    """
    parts = (
        [p for p in configuration.split("+") if p] if isinstance(configuration, str) else list(configuration)
    )
    return tuple(sorted(set(parts)))


def new_run_id() -> str:
    """A run id that sorts by start time: ``20261202T183456-1a2b3c``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]


#: how many memory plans an environment keeps for a reader (``Environment.memory_plans``): the latest
MEMORY_PLANS_KEPT = 4096


@dataclasses.dataclass
class EnvStats:
    """Counters: cells asked, answered from the table, run by the runner (a cell the deadline kept from
    starting is not counted), configuration rows derived from an action row that was already there."""

    asked: int = 0
    from_table: int = 0
    evaluations: int = 0
    action_reuse: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class Environment:
    """Cells in, reward rows out (see the module docstring).

    Args:
        runner: where missing cells are computed and missing profiles collected.
        rewriter: the default rewriter (``outcome(..., rewriter=None)``).
        rewards, profiles, candidates: the tables this environment reads and appends to.
        source: the profile source policies route on ("ncu" or "torch"; None: any).
        fetch_profiles: collect groups the profile table lacks through the runner (live) or not (replay).
        run_id: stored in rows computed by this environment.
    """

    def __init__(
        self,
        runner: Runner,
        rewriter: Rewriter | None,
        rewards: RewardTable,
        profiles: ProfileTable,
        candidates: ParquetTable,
        source: str | None = None,
        fetch_profiles: bool = False,
        run_id: str | None = None,
    ):
        self.runner = runner
        self.rewriter = rewriter
        self.rewards = rewards
        self.profiles = profiles
        self.candidates = candidates
        self.source = source
        self.run_id = run_id or new_run_id()
        self.profiler = RecordedProfiler(profiles, source, self.prefetch if fetch_profiles else None)
        self.stats = EnvStats()
        # the evaluator's memory plan of the latest cells computed here whose plan has the candidate's
        # device peak (``RewardRow.memory``, not a column), by cell key: the recording logs them
        self.memory_plans: dict[str, dict] = {}
        self._rewriters: dict[str, Rewriter] = {}
        self._rules: dict[str, ActionRewriter] = {}  # the registered rewriters that are rule-based
        if rewriter is not None:
            self._register(rewriter)

    # --- rewriters ---------------------------------------------------------------------------------
    def use_rewriter(self, rewriter: Rewriter) -> None:
        """Make ``rewriter`` the default from now on (e.g. one fitted once the training tasks are known)."""
        self.rewriter = rewriter
        self._register(rewriter)

    def _register(self, rewriter: Rewriter) -> None:
        if self._rewriters.get(rewriter.identity) is rewriter:
            return  # every cell() call registers its rewriter: the same object is already known
        self._rewriters[rewriter.identity] = rewriter
        # checked once here: isinstance against a runtime Protocol probes every member, per call
        if isinstance(rewriter, ActionRewriter):
            self._rules[rewriter.identity] = rewriter
        else:
            self._rules.pop(rewriter.identity, None)

    def rewriter_identity(self, rewriter: Rewriter | str | None = None) -> str:
        """The identity of ``rewriter`` (a string passes through; None: the default's)."""
        if isinstance(rewriter, str):
            return rewriter
        rewriter = self.rewriter if rewriter is None else rewriter
        if rewriter is None:
            raise ValueError("no rewriter: pass one to outcome() or to the environment")
        self._register(rewriter)
        return rewriter.identity

    def cell(
        self,
        task: Task,
        configuration: str | Iterable[str] = (),
        rewriter: Rewriter | str | None = None,
        seed: int = 0,
        round: int = 0,
        policy: str = "",
    ) -> Cell:
        """The configuration cell of ``task`` shown ``configuration`` (a name or groups)."""
        return Cell(
            task,
            configuration_groups(configuration),
            self.rewriter_identity(rewriter),
            seed,
            round,
            policy=policy,
        )

    # --- profiles ----------------------------------------------------------------------------------
    def prefetch(self, tasks: Sequence[Task], groups: Iterable[str]) -> list[dict[str, str]]:
        """Collect every (task, group) the profile table lacks, batched by missing set; record them.

        Returns failures ``[{"task_id", "error"}]``; every other task's groups are recorded.
        """
        groups = sorted(set(groups))
        by_missing: dict[tuple[str, ...], list[Task]] = {}
        for t in tasks:
            missing = tuple(sorted(set(groups) - self.profiler.recorded_groups(t)))
            if missing:
                by_missing.setdefault(missing, []).append(t)
        failures: list[dict[str, str]] = []
        for missing, batch in by_missing.items():
            held = [self._held(t, groups) for t in batch]  # e.g. the root: range replay decides on it
            for task, result in zip(batch, self.runner.profile(batch, list(missing), held), strict=True):
                if isinstance(result, CellFailure):
                    failures.append({"task_id": task.id, "error": result.message[:500]})
                else:
                    self.record_profile(task, result, missing)
        self.profiles.flush()
        return failures

    def _held(self, task: Task, groups: Sequence[str]) -> Profile | None:
        held = sorted(self.profiler.recorded_groups(task) & set(groups))
        return self.profiler.snapshot(task, held) if held else None

    def record_profile(self, task: Task, profile: Profile, groups: Sequence[str]) -> None:
        """Record ``groups`` of one collection, sharing its cost among them by catalog pass counts."""
        from autoprofiler.profiling.groups import GROUPS

        provenance = self.runner_provenance()
        env = CacheEnvironment(profile.device or provenance.device, provenance.driver, provenance.ncu_version)
        known = [GROUPS[g].passes if g in GROUPS else None for g in groups]
        weights = known if all(known) else [1] * len(groups)
        total = float(sum(weights)) or 1.0
        for g, w in zip(groups, weights, strict=True):
            share = dataclasses.replace(
                profile,
                passes=round(int(profile.passes or 0) * w / total),
                seconds=float(profile.seconds or 0.0) * w / total,
            )
            self.profiles.append(
                profile_record(
                    share,
                    g,
                    env,
                    task_id=task.id,
                    level=int(task.level),
                    torch_version=provenance.torch_version,
                    git_sha=provenance.git_sha,
                    git_dirty=provenance.git_dirty,
                    run_id=self.run_id,
                    worker=provenance.worker,
                )
            )

    def runner_provenance(self) -> Provenance:
        """Provenance of the runner's workers (device, driver, tool, code)."""
        return self.runner.provenance()

    def profile(self, task: Task, groups: Iterable[str]) -> Profile | None:
        """The task's profile with (at least) these groups; cumulative like ``Profiler.collect``."""
        return self.profiler.collect(task, groups)

    def group_cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        """(passes, seconds) of collecting these groups for the task from nothing."""
        return self.profiler.cost(task, groups)

    def recorded_tasks(self) -> set[str]:
        """Hashes of tasks with at least one recorded profile group."""
        return self.profiles.task_hashes()

    def fully_recorded(self, tasks: Sequence[Task]) -> tuple[list[Task], dict[str, list[str]]]:
        """The recorded ``tasks`` that hold every group any of them holds, and, by task id, what the others
        lack: judge policies on the first list only, so each one answers every task."""
        recorded = self.recorded_tasks()
        have = {t.hash: self.profiler.recorded_groups(t) for t in tasks if t.hash in recorded}
        union = set().union(*have.values()) if have else set()
        mine = [t for t in tasks if t.hash in have]
        lacking = {t.id: sorted(union - have[t.hash]) for t in mine if union - have[t.hash]}
        return [t for t in mine if t.id not in lacking], lacking

    def candidate_source(self, candidate_hash: str) -> str | None:
        row = self.candidates.get(candidate_hash)
        return None if row is None else row["source"]

    # --- outcomes ----------------------------------------------------------------------------------
    def try_outcomes(
        self, cells: Sequence[Cell], deadline: float | None = None
    ) -> list[RewardRow | CellFailure]:
        """The row of every cell, or why it has none; computes only what the reward table lacks.

        Missing cells go to the runner in one call (``deadline``: cells whose batch would not end by
        then, judged by the runner's longest batch so far, are ``not_started``). Each row is stored as
        it arrives, so a run stopped midway keeps its rows.
        """
        self.stats.asked += len(cells)
        failures: dict[str, CellFailure] = {}
        derived: list[tuple[Cell, Cell, Profile | None]] = []
        need: dict[str, WorkItem] = {}
        for cell in cells:
            if cell.key in self.rewards:
                self.stats.from_table += 1
                continue
            rule = self._rules.get(cell.rewriter)
            derive = cell.kind == "configuration" and rule is not None
            shown = None  # a replay answers any other cell by its key, without its profile
            if derive or self.profiler.fetch is not None:
                try:
                    shown = self.profiler.snapshot(cell.task, cell.groups)
                except MissingProfile as exc:
                    failures[cell.key] = CellFailure(cell.key, "missing_profile", str(exc))
                    continue
            if derive:
                action, _ = rule.decide(shown)
                acell = Cell(
                    cell.task, (), rule.actions_identity, cell.seed, cell.round, action, policy="action"
                )
                derived.append((cell, acell, shown))
                if acell.key in self.rewards:
                    self.stats.action_reuse += 1
                else:
                    need.setdefault(acell.key, WorkItem(acell))
            else:
                need.setdefault(cell.key, WorkItem(cell, shown))
        if need:

            def store(result: RewardRow | CellFailure) -> None:
                if isinstance(result, CellFailure):
                    failures[result.key] = result
                else:
                    self._store(result)
                if not (isinstance(result, CellFailure) and result.kind == "not_started"):
                    self.stats.evaluations += 1

            self.runner.run_cells(list(need.values()), deadline, on_result=store)
        for cell, acell, shown in derived:
            arow = self.rewards.get(acell.key)
            if arow is None:
                failures[cell.key] = failures.get(acell.key) or CellFailure(
                    cell.key, "missing", acell.describe()
                )
                if failures[cell.key].kind == "missing":
                    failures[cell.key] = CellFailure(
                        cell.key,
                        "missing",
                        f"no recorded outcome for {acell.describe()} (chosen for configuration "
                        f"{cell.configuration!r})",
                    )
                continue
            cost = (int(shown.passes or 0), float(shown.seconds or 0.0)) if shown is not None else (0, 0.0)
            self._store(arow.for_cell(cell, profile_passes=cost[0], profile_seconds=cost[1]))
        self.flush()
        return [self.rewards.get(c.key) or failures[c.key] for c in cells]

    def outcomes(self, cells: Sequence[Cell], deadline: float | None = None) -> list[RewardRow]:
        """Like ``try_outcomes``; a cell without a row raises (``MissingOutcome``, ``MissingProfile``,
        ``CellFailed``) after every row that could be computed is stored."""
        results = self.try_outcomes(cells, deadline)
        for result in results:
            if isinstance(result, CellFailure):
                raise_failure(result)
        return results  # type: ignore[return-value]

    def outcome(
        self,
        task: Task,
        configuration: str | Iterable[str] = (),
        rewriter: Rewriter | str | None = None,
        seed: int = 0,
        round: int = 0,
    ) -> RewardRow:
        """The row of one configuration cell (``outcomes`` of one). For a refinement round > 0 pass the
        task ``refinement_task`` built (the program being improved)."""
        return self.outcomes([self.cell(task, configuration, rewriter, seed, round)])[0]

    def _store(self, row: RewardRow) -> None:
        if not row.run_id:
            row = row.replace(run_id=self.run_id)
        if row.memory and "candidate_peak_reserved_bytes" in row.memory:
            self.memory_plans[row.key] = row.memory
            if len(self.memory_plans) > MEMORY_PLANS_KEPT:  # a reader that never takes them
                del self.memory_plans[next(iter(self.memory_plans))]
        if row.candidate_source is not None:
            self.candidates.append(
                {"key": row.candidate_hash, "task_hash": row.task_hash, "source": row.candidate_source}
            )
        self.rewards.append(row)

    def rows(self) -> list[RewardRow]:
        return self.rewards.rows()

    def flush(self) -> None:
        for table in (self.rewards, self.profiles, self.candidates):
            table.flush()

    def close(self) -> None:
        """Write what is buffered and close the runner (its workers' evaluator pools)."""
        self.flush()
        self.runner.close()


class LiveEnvironment(Environment):
    """Profiles, rewrites and evaluates on demand; stores everything under ``table_dir``.

    Args:
        profiler, rewriter, evaluator: a worker's parts, run in this process (``LocalDriver``); or pass
            ``runner`` (e.g. a ``RayDriver`` over ``GpuWorker`` actors) and no profiler/evaluator.
        table_dir: folder of the ``rewards/``, ``profiles/`` and ``candidates/`` tables.
        flush_every: rows buffered before a Parquet part is written.
        run_id: this run (the tables' partition); provenance: overrides of the worker's detected one.
    """

    def __init__(
        self,
        profiler: Any = None,
        rewriter: Rewriter | None = None,
        evaluator: Any = None,
        table_dir: str | Path = "runs/tables",
        flush_every: int = 4,
        run_id: str | None = None,
        provenance: Provenance | None = None,
        runner: Runner | None = None,
        source: str | None = None,
    ):
        run_id = run_id or new_run_id()
        if runner is None:
            worker = CellWorker(
                profiler=profiler, evaluator=evaluator, rewriter=rewriter, provenance=provenance
            )
            runner = LocalDriver(worker)
            source = source or profiler.source
        self.table_dir = Path(table_dir)
        super().__init__(
            runner,
            rewriter,
            RewardTable(self.table_dir / "rewards", flush_every, run_id),
            ProfileTable(self.table_dir / "profiles", flush_every, run_id),
            ParquetTable(self.table_dir / "candidates", CANDIDATE_SCHEMA, flush_every, run_id),
            source=source,
            fetch_profiles=True,
            run_id=run_id,
        )


class ReplayEnvironment(Environment):
    """Answers profiles and outcomes from a recording (``profiles/``, ``rewards/``, ``candidates/``), or
    from the union of several recordings replayed together.

    A rule rewriter's configuration rows are derived from the recorded profiles and action rows, so
    every configuration of a task ``coverage`` uses is answerable; for any other rewriter only recorded
    cells are. What the recording cannot answer raises ``MissingOutcome`` or ``MissingProfile`` naming
    the cell. Several recordings: each table is the union of theirs, in the order given, so a key (a
    cell, a (task, group, profiling environment)) two of them hold is answered from the first.

    Args:
        recording: the recording's folder, or a sequence of folders.
        rewriter: the default rewriter.
        source: which profile source to answer from ("ncu" or "torch"); None takes any.
        runner: default: a ``LocalDriver`` over a ``ReplayWorker`` (``RayDriver.start_replay`` for many).
        out_dir: where derived rows are written (default: kept in memory).
    """

    def __init__(
        self,
        recording: str | Path | Sequence[str | Path],
        rewriter: Rewriter | None = None,
        source: str | None = None,
        runner: Runner | None = None,
        out_dir: str | Path | None = None,
    ):
        self.recordings = recording_folders(recording)
        if not self.recordings:
            raise ValueError("a replay needs at least one recording folder")
        for folder in self.recordings:
            for sub in ("profiles", "rewards"):
                if not (folder / sub).is_dir():
                    raise FileNotFoundError(
                        f"expected a recording with {sub}/ under {folder}; it is not there"
                    )
        profiles = ProfileTable(None, read_from=[r / "profiles" for r in self.recordings])
        #: the recordings' reward rows (the replay's answers; ``rewards`` holds the rows derived from them)
        self.recorded = RewardTable(None, read_from=[r / "rewards" for r in self.recordings])
        if runner is None:
            worker = ReplayWorker(self.recordings, source, profiles=profiles, rewards=self.recorded)
            runner = LocalDriver(worker, batch_size=256)
        super().__init__(
            runner,
            rewriter,
            RewardTable(Path(out_dir) / "rewards" if out_dir else None),
            profiles,
            ParquetTable(None, CANDIDATE_SCHEMA, read_from=[r / "candidates" for r in self.recordings]),
            source=source,
        )

    @classmethod
    def from_dir(
        cls, recording: str | Path, rewriter: Rewriter | None = None, source: str | None = None
    ) -> ReplayEnvironment:
        """A replay of a folder that ``LiveEnvironment`` (or ``record``) wrote."""
        return cls(recording, rewriter, source)

    def coverage(self, tasks: Sequence[Task], seeds: Sequence[int] = (0,)) -> Coverage:
        """Which ``tasks`` the recordings answer in full: every group any recorded task holds and, for a
        rule rewriter (the default one), every action's reward row for each of ``seeds``; the others,
        with why, and the recording each task comes from (``environments.coverage``)."""
        rule = self._rules.get(self.rewriter.identity) if self.rewriter is not None else None
        return task_coverage(tasks, self.recordings, self.profiler, self.profiles, self.recorded, rule, seeds)

    def fully_recorded(
        self, tasks: Sequence[Task], seeds: Sequence[int] = (0,)
    ) -> tuple[list[Task], dict[str, list[str]]]:
        """``coverage``'s used tasks, and by task id why each other task with a recorded profile is left
        out: the groups it lacks, then ``action <name>`` for each action without a row. A task with no
        profile row at all is in neither (``recorded_tasks``)."""
        cov = self.coverage(tasks, seeds)
        recorded = self.recorded_tasks()
        profiled = {t.id for t in tasks if t.hash in recorded}
        return list(cov.used), {i: why for i, why in cov.reasons().items() if i in profiled}

    def rows_per_recording(self) -> dict[Path, dict[str, int]]:
        """Recording -> the profile and reward rows read from it (a key two hold counted at the first)."""
        profiles = {p.parent: n for p, n in self.profiles.rows_per_source().items()}
        rewards = {p.parent: n for p, n in self.recorded.rows_per_source().items()}
        return {rec: {"profile_rows": profiles[rec], "reward_rows": rewards[rec]} for rec in self.recordings}
