"""Workers: where cells become reward rows and tasks become profiles.

``CellWorker`` holds one device's expensive state, built once in ``__init__``: the warm pool of
sandboxed evaluation processes, the profiler and its cache, the rewriter. Its methods take batches:

    worker = CellWorker(WorkerSpec(device="cpu", task_size="small", source="torch"))
    rows = worker.run_cells([WorkItem(cell, shown_profile), ...])     # RewardRow | CellFailure each
    profiles = worker.profile(tasks, ["torch_root", "torch_memory"])    # Profile | CellFailure each

The same class is the Ray actor ``GpuWorker`` (``autoprofiler.runtime.ray_driver``): one per GPU,
``num_gpus=1`` (or none on a laptop or CI). ``ReplayWorker`` answers the same two methods from a
recording, so the replay environment and the live one share the environment and driver code.

Untrusted code never runs in a worker's own process: candidates and tasks run in the evaluator's
sandboxed processes and in the profiler's subprocesses.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from autoprofiler.cells import CellFailure, RewardRow, WorkItem, run_cell
from autoprofiler.provenance import Provenance, detect, physical_gpu
from autoprofiler.rewriters.base import ActionRewriter, Rewriter

if TYPE_CHECKING:
    from autoprofiler.optimize import Optimized
    from autoprofiler.profiling.cache import CacheEnvironment
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.tasks import Task
    from autoprofiler.tree import ProfilingTree

__all__ = ["CellWorker", "ReplayWorker", "TaskProfiler", "WorkerSpec", "rewriter_for"]

logger = logging.getLogger(__name__)


class TaskProfiler(Protocol):
    """What a worker needs of a profiler (``autoprofiler.profiling.Profiler`` is one)."""

    source: str

    @property
    def environment(self) -> CacheEnvironment: ...

    def collect(self, task: Task, groups: Sequence[str]) -> Profile: ...

    def collect_many(self, tasks: Sequence[Task], groups: Sequence[str]) -> list[Profile]: ...

    def remember(self, profile: Profile) -> None: ...

    def forget(self, task_hash: str | None = None) -> None: ...


@dataclass(frozen=True)
class WorkerSpec:
    """Plain data describing a worker; each worker (a Ray actor anywhere) builds its state from it.

    Attributes:
        device: "cpu", "cuda" (the actor's GPU) or "cuda:N".
        task_size: "full" or "small" (``AUTOPROFILER_TASK_SIZE`` in the sandbox).
        source: profile source, "ncu" or "torch".
        eval: ``EvalConfig`` fields other than device and task size.
        rewriter, rewriter_options: ``rewriters.make_rewriter(rewriter, **rewriter_options)``.
        llm: ``ChatClient`` settings (base_url, model) for the openai rewriter.
        profile_cache: a ``ProfileCache`` folder on the worker's node (None: memory only).
        range_replay_above: ncu range replay for tasks with more kernels than this.
        concurrency: cells this worker evaluates at once (compilation and correctness checks overlap;
            timing stays one at a time under a lock); also the Ray actor's ``max_concurrency``.
        run_id: stored in every row.
    """

    device: str = "cpu"
    task_size: str = "small"
    source: str = "torch"
    eval: dict[str, Any] = field(default_factory=dict)
    rewriter: str = "rule"
    rewriter_options: dict[str, Any] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)
    profile_cache: str | None = None
    range_replay_above: int | None = None
    concurrency: int = 1
    run_id: str = ""

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"concurrency: expected >= 1, got {self.concurrency}")


def rewriter_for(cell_rewriter: str, action: str, rewriter: Rewriter) -> Rewriter:
    """The rewriter that writes a cell's candidate: ``rewriter`` itself, or one of its actions.

    Raises ``ValueError`` when the cell names a rewriter this one is not.
    """
    if action:
        if not isinstance(rewriter, ActionRewriter):
            raise ValueError(f"action cell {action!r} needs a rule rewriter, got {rewriter.identity!r}")
        fixed = rewriter.for_action(action)
        if fixed.identity != cell_rewriter:
            raise ValueError(
                f"action cell for {cell_rewriter!r}, but this worker's actions are {fixed.identity!r}"
            )
        return fixed
    if rewriter.identity != cell_rewriter:
        raise ValueError(f"cell for rewriter {cell_rewriter!r}, but this worker holds {rewriter.identity!r}")
    return rewriter


def _build_rewriter(spec: WorkerSpec) -> Rewriter:
    from autoprofiler.rewriters import make_rewriter

    options = dict(spec.rewriter_options)
    if spec.rewriter == "openai":
        from autoprofiler.llm import ChatClient

        options.setdefault(
            "client", ChatClient(base_url=spec.llm.get("base_url"), model=spec.llm.get("model"))
        )
    return make_rewriter(spec.rewriter, **options)


def _host_path(name: str) -> str:
    """``$TMPDIR/autoprofiler-<name>``: a path every worker process of this host agrees on."""
    return str(Path(os.environ.get("TMPDIR", "/tmp")) / f"autoprofiler-{name}")


def _host_file(device: str, what: str, suffix: str) -> str:
    """A file the workers using one device of this host share, whichever process they run in:
    ``$TMPDIR/autoprofiler-<what>-<gpu or device>.<sfx>`` (one per physical GPU, see ``physical_gpu``)."""
    safe = physical_gpu(device) or device.replace(":", "_")
    return _host_path(f"{what}-{safe}.{suffix}")


class CellWorker:
    """Runs cells and profiles tasks on one device (see the module docstring).

    Build it from a ``WorkerSpec`` (what a Ray actor does), or hand it ready parts (``profiler``,
    ``evaluator``, ``rewriter``), e.g. a test's doubles; parts given win over the spec.
    """

    def __init__(
        self,
        spec: WorkerSpec | None = None,
        *,
        profiler: TaskProfiler | None = None,
        evaluator: Any = None,
        rewriter: Rewriter | None = None,
        provenance: Provenance | None = None,
    ):
        self.spec = spec or WorkerSpec()
        # "host:pid", or "host:gpu1:pid" on a GPU: rows of a multi-GPU run say which GPU evaluated them
        self.gpu = physical_gpu(self.spec.device)
        self.name = ":".join([socket.gethostname(), *([self.gpu] if self.gpu else []), str(os.getpid())])
        self.rewriter = rewriter if rewriter is not None else _build_rewriter(self.spec)
        self.profiler = profiler if profiler is not None else self._build_profiler()
        self.evaluator = evaluator if evaluator is not None else self._build_evaluator()
        self.provenance = provenance or self._detect_provenance()

    # --- construction --------------------------------------------------------------------------------
    def _build_profiler(self):
        from autoprofiler.profiling import ProfileCache, Profiler

        s = self.spec
        return Profiler(
            source=s.source,
            device=s.device,
            task_size=s.task_size,
            cache=ProfileCache(s.profile_cache) if s.profile_cache else None,
            range_replay_above=s.range_replay_above if s.source == "ncu" else None,
        )

    def _build_evaluator(self):
        from autoprofiler.evaluation import EvalConfig, Evaluator

        s = self.spec
        options = dict(s.eval)
        # every worker on this host and GPU, whatever its own concurrency: two one-cell workers on one
        # GPU would otherwise time at the same moment (workers on other GPUs have their own lock)
        options.setdefault("timing_lock", _host_file(s.device, "timing", "lock"))
        # and their memory plans count each other's (concurrent cells on one device would overcommit it)
        options.setdefault("memory_ledger", _host_file(s.device, "memory", "json"))
        # and workers timing at once on different GPUs of the host time on different CPU cores
        options.setdefault("core_claims", _host_path("cores"))
        config = EvalConfig(device=s.device, task_size=s.task_size, **options)
        return Evaluator(config, spares=s.concurrency)

    def _detect_provenance(self) -> Provenance:
        device = driver = tool = ""
        try:
            environment = self.profiler.environment
            device, driver, tool = environment.device, environment.driver, environment.tool
        except Exception as exc:  # no ncu or no GPU name: rows still carry the evaluator's device
            logger.warning("no profiler provenance: %s", exc)
        return detect(
            device=device,
            driver=driver,
            tool=tool,
            profile_source=self.profiler.source,
            run_id=self.spec.run_id,
            worker=self.name,
        )

    # --- the two methods -------------------------------------------------------------------------------
    def run_cells(self, items: Sequence[WorkItem]) -> list[RewardRow | CellFailure]:
        """``run_cell`` on each item, in order; a machinery failure is a ``CellFailure``, not an exception."""
        from autoprofiler.evaluation import EvaluatorError, TaskError

        out: list[RewardRow | CellFailure] = []
        for item in items:
            cell = item.cell
            try:
                rewriter = rewriter_for(cell.rewriter, cell.action, self.rewriter)
                out.append(run_cell(cell, item.shown, rewriter, self.evaluator, self.provenance))
            except TaskError as exc:
                out.append(CellFailure(cell.key, "task_error", f"{cell.describe()}: {exc}"[:2000]))
            except EvaluatorError as exc:
                message = f"{cell.describe()}: {exc}"[:2000]
                out.append(CellFailure(cell.key, "evaluator_error", message, cause=exc.cause))
        return out

    def profile(
        self, tasks: Sequence[Task], groups: Sequence[str], held: Sequence[Profile | None] = ()
    ) -> list[Profile | CellFailure]:
        """Collect ``groups`` for every task (batched: one profiled process per distinct missing set).

        ``held``: profiles already recorded for the tasks (e.g. the root), remembered first so the
        profiler can use them (range replay decides on the root's kernel count). A task whose program
        fails is a ``CellFailure`` keyed by its hash; the others are kept. Environment problems (no
        ncu, counters not permitted) raise.
        """
        from autoprofiler.profiling import CountersNotPermitted, NcuNotFound, ProfilerError

        for profile in held:
            if profile is not None:
                self.profiler.remember(profile)
        groups = list(groups)
        try:
            return list(self.profiler.collect_many(list(tasks), groups))
        except (NcuNotFound, CountersNotPermitted):
            raise
        except ProfilerError as exc:  # isolate the failing tasks; collect the others one by one
            bad = dict(exc.failures)
            logger.warning("batch profiling failed for %d task(s): %s", len(bad) or len(tasks), exc)
        out: list[Profile | CellFailure] = []
        for task in tasks:
            if task.hash in bad:
                out.append(CellFailure(task.hash, "task_error", f"{task.id}: {bad[task.hash]}"[:2000]))
                continue
            self.profiler.forget(task.hash)  # collected in the failed batch: re-collect for its cost
            try:
                out.append(self.profiler.collect(task, groups))
            except (NcuNotFound, CountersNotPermitted):
                raise
            except ProfilerError as exc:
                out.append(
                    CellFailure(task.hash, "task_error", f"{task.id}: {type(exc).__name__}: {exc}"[:2000])
                )
        return out

    def optimize(
        self, tasks: Sequence[Task], tree: ProfilingTree, seed: int = 0, timing_trials: int | None = None
    ) -> list[Optimized]:
        """``autoprofiler.optimize.optimize`` on this worker: route by ``tree`` with its profiler, rewrite
        once, evaluate; one ``Optimized`` per task. The Serve app's ``/optimize`` calls it on a
        ``GpuWorker``, so a submitted task runs only in this worker's subprocesses and sandbox.

        ``timing_trials`` overrides the evaluator's for these cells (its warm workers are kept).
        """
        from autoprofiler.optimize import optimize
        from autoprofiler.policies import TreePolicy
        from autoprofiler.runtime.driver import LocalDriver

        worker = self
        if timing_trials is not None:
            evaluator = _PerCallConfig(self.evaluator, timing_trials=timing_trials)
            worker = CellWorker(
                self.spec,
                profiler=self.profiler,
                evaluator=evaluator,
                rewriter=self.rewriter,
                provenance=self.provenance,
            )
        policy = TreePolicy(tree)
        return optimize(list(tasks), policy, self.profiler, LocalDriver(worker), self.rewriter, seed)

    def info(self) -> dict[str, Any]:
        """Who this worker is: pid, host, GPU (``physical_gpu``), device, provenance (for logs and tests)."""
        return {
            "pid": os.getpid(),
            "name": self.name,
            "gpu": self.gpu,
            "spec": self.spec,
            "provenance": self.provenance,
        }

    def close(self) -> None:
        self.evaluator.close()


class _PerCallConfig:
    """An evaluator that evaluates with its own config changed in a few fields (e.g. timing trials)."""

    def __init__(self, evaluator: Any, **changes: Any):
        import dataclasses

        self.evaluator = evaluator
        self.config = dataclasses.replace(evaluator.config, **changes)

    def evaluate(self, task: Task, candidate_source: str):
        return self.evaluator.evaluate(task, candidate_source, self.config)


class ReplayWorker:
    """Answers ``run_cells`` and ``profile`` from a recording (its reward and profile tables).

    A cell is answered by its key; one the recording does not hold is a ``CellFailure`` of kind
    ``missing`` naming the cell. Profiles are the recorded ones, at their recorded cost. Given several
    recordings it answers from their union (``tables.ParquetTable``'s ``read_from``: on a key two of
    them hold, the first listed wins).

    The profile table is read on the first ``profile`` call, not before: a replay environment answers
    profiles from its own copy, so a replay actor that only answers cells never holds the recording's
    profiles (most of its size: per-kernel metrics).
    """

    def __init__(
        self,
        recording: str | Path | Sequence[str | Path],
        source: str | None = None,
        profiles: Any = None,
        rewards: Any = None,
    ):
        from autoprofiler.tables import RewardTable, recording_folders

        self.recordings = recording_folders(recording)
        self.rewards = (
            rewards
            if rewards is not None
            else RewardTable(None, read_from=[r / "rewards" for r in self.recordings])
        )
        self._profiles = profiles
        self.source = source
        self.provenance = detect(worker="replay:" + ",".join(map(str, self.recordings)))

    @property
    def profiles(self) -> Any:
        """The recording's profile table (``ProfileTable``), read when first needed."""
        if self._profiles is None:
            from autoprofiler.tables import ProfileTable

            self._profiles = ProfileTable(None, read_from=[r / "profiles" for r in self.recordings])
        return self._profiles

    def run_cells(self, items: Sequence[WorkItem]) -> list[RewardRow | CellFailure]:
        out: list[RewardRow | CellFailure] = []
        for item in items:
            row = self.rewards.get(item.cell.key)
            if row is None:
                note = (
                    ""
                    if item.cell.action
                    else (": only recorded cells are answerable for a rewriter that is not rule-based")
                )
                out.append(
                    CellFailure(
                        item.cell.key, "missing", f"no recorded outcome for {item.cell.describe()}{note}"
                    )
                )
            else:
                out.append(row)
        return out

    def profile(
        self, tasks: Sequence[Task], groups: Sequence[str], held: Sequence[Profile | None] = ()
    ) -> list[Profile | CellFailure]:
        from autoprofiler.environments.profiles import MissingProfile, RecordedProfiler

        recorded = RecordedProfiler(self.profiles, self.source)
        out: list[Profile | CellFailure] = []
        for task in tasks:
            try:
                out.append(recorded.snapshot(task, groups))
            except MissingProfile as exc:
                out.append(CellFailure(task.hash, "missing_profile", str(exc)))
        return out

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "recordings": list(map(str, self.recordings)),
            "provenance": self.provenance,
        }

    def close(self) -> None:
        pass
