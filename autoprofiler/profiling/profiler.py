"""Profiler: collect metric groups for tasks, sequentially or in batches, through a cache.

Sequential semantics (what a profiling tree needs): ``collect(task, groups)`` returns the task's
cumulative profile with every group asked for; a group already collected for the task (in this
profiler's memory or in the cache) is never collected again, so routing root -> node -> leaf pays each
group once. ``Profile.passes``/``seconds`` report what *this call* spent (0 when nothing ran).

Batch mode: ``collect_many(tasks, groups)`` profiles all tasks that miss the same groups in one process
(one NVTX range per task), amortizing the ~5 s of Python + CUDA start-up; each task's ``seconds`` is
its share of the run (run wall time / tasks in the run) and ``passes`` its own kernels' replay passes.

A failed run caches nothing for the failed tasks; tasks of the same batch that succeeded are kept and
cached, then the error is raised with ``error.failures = {task_hash: reason}``.

Example (CPU, torch source; on the H200 use ``Profiler(source="ncu", cache=ProfileCache("runs/cache"))``
and ncu groups such as ``["root"]`` then ``["root", "memory"]``):
    >>> from autoprofiler.tasks import load_task_file
    >>> from autoprofiler.profiling import Profiler
    >>> profiler = Profiler(source="torch", device="cpu", task_size="small")
    >>> task = load_task_file("datasets/suite/l1/relu.py")
    >>> first = profiler.collect(task, ["torch_root"])                    # one process, a few seconds
    >>> second = profiler.collect(task, ["torch_root", "torch_ops"])      # collects torch_ops only
    >>> sorted(second.groups), [run.groups for run in profiler.runs]
    (['torch_ops', 'torch_root'], [('torch_root',), ('torch_ops',)])
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from autoprofiler.profiling import ncu as ncu_mod
from autoprofiler.profiling.cache import CacheEnvironment, ProfileCache
from autoprofiler.profiling.groups import GROUPS, ncu_request_metrics, resolve_groups
from autoprofiler.profiling.ncu import NoKernelsProfiled, ProfilerError, ProgramFailed
from autoprofiler.profiling.profile import DURATION_METRIC, Profile, profile_from_kernels
from autoprofiler.profiling.torch_source import profile_from_torch_result
from autoprofiler.text import first_line

log = logging.getLogger(__name__)

SOURCES = ("ncu", "torch")
KERNEL_COUNT = "derived__kernel_count"
# Task-level values a range-replay row cannot know (it is one row for the whole range): the root's.
ROOT_OWNED = (KERNEL_COUNT, DURATION_METRIC, "derived__launch_overhead_share")
TASK_SIZES = ("full", "small")
RANGE_RETRIES = 8  # range-replay runs that may each drop the metrics ncu names as unsupported
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunRecord:
    """One subprocess the profiler started: which tasks, which groups, what it cost."""

    task_hashes: tuple[str, ...]
    groups: tuple[str, ...]
    seconds: float
    ok: bool


class Profiler:
    """Collect metric groups for tasks (see module docstring).

    Args:
        source: ``"ncu"`` (Nsight Compute, GPU) or ``"torch"`` (torch.profiler, CPU or GPU).
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (torch source only).
        cache: a :class:`ProfileCache`, or ``None`` for memory only.
        task_size: exported as ``AUTOPROFILER_TASK_SIZE`` to the profiled program (``full``/``small``).
        timeout_s: wall-clock limit of one profiled process (profiling + report export).
        ncu_path: the ncu executable (name on PATH or a path).
        seed: torch seed for the model and inputs.
        environment: pin the cache identity (device, driver, tool) instead of detecting it.
        capture_dir: when set, every run's raw ncu CSV / program result is written there.
        python: interpreter for the profiled program (default: this one).
        warmup, timing_calls: forward calls before profiling, and timed calls for the wall time.
        nvtx_filter: ``"outer"`` (``--nvtx-include autoprofiler/``, the default) or ``"per_task"``
            (``--nvtx-include ap:<hash>/`` per task).
        range_replay_above: ncu only; ``None`` (default) replays every kernel. Set (e.g. 64), a task whose
            root group shows more kernels gets its other groups with ``--replay-mode range``: ncu replays
            the task's whole NVTX range once per pass and reports range-level values (one row), instead
            of replaying each of its kernels (a loop of 1,280 launches x 60 passes took over 9 minutes on
            the H200). Its kernel table, kernel count and summed kernel time stay the root's.
    """

    def __init__(
        self,
        source: str = "ncu",
        device: str = "cuda",
        cache: ProfileCache | None = None,
        task_size: str = "full",
        timeout_s: float = 600.0,
        ncu_path: str = "ncu",
        *,
        seed: int = 42,
        environment: CacheEnvironment | None = None,
        capture_dir: str | os.PathLike | None = None,
        python: str | None = None,
        warmup: int = 3,
        timing_calls: int = 5,
        nvtx_filter: str = "outer",
        range_replay_above: int | None = None,
    ):
        if source not in SOURCES:
            raise ValueError(f"source={source!r}: expected one of {SOURCES}")
        if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
            raise ValueError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        if source == "ncu" and device == "cpu":
            raise ValueError("source='ncu' needs a CUDA device, got device='cpu' (use source='torch')")
        if nvtx_filter not in ("outer", "per_task"):
            raise ValueError(f"nvtx_filter={nvtx_filter!r}: expected 'outer' or 'per_task'")
        if task_size not in TASK_SIZES:
            raise ValueError(f"task_size={task_size!r}: expected one of {TASK_SIZES}")
        self.source = source
        self.device = device
        self.cache = cache
        self.task_size = task_size
        self.timeout_s = float(timeout_s)
        self.ncu_path = ncu_path
        self.seed = int(seed)
        self.capture_dir = Path(capture_dir) if capture_dir else None
        self.python = python or sys.executable
        self.warmup = int(warmup)
        self.timing_calls = int(timing_calls)
        self.nvtx_filter = nvtx_filter
        if range_replay_above is not None and int(range_replay_above) < 1:
            raise ValueError(f"range_replay_above={range_replay_above!r}: expected None or >= 1 kernels")
        self.range_replay_above = None if range_replay_above is None else int(range_replay_above)
        self._environment = environment
        self._memory: dict[str, Profile] = {}
        self.runs: list[RunRecord] = []
        self.range_dropped: set[str] = set()  # metrics ncu refused under range replay, learned here

    # --- identity ----------------------------------------------------------------------------------
    @property
    def environment(self) -> CacheEnvironment:
        """(device, driver, tool) of this profiler: detected once, part of every cache key."""
        if self._environment is None:
            if self.device == "cpu":
                name, driver = "cpu", ""
            else:
                name, driver = ncu_mod.gpu_identity(self.device)
            if self.source == "ncu":
                tool = f"ncu {ncu_mod.ncu_version(self.ncu_path)}"
            else:
                try:
                    tool = f"torch {importlib.metadata.version('torch')}"
                except importlib.metadata.PackageNotFoundError:
                    tool = "torch unknown"
            self._environment = CacheEnvironment(device=name, driver=driver, tool=tool)
            log.info("profiler environment: %s", self._environment)
        return self._environment

    # --- public API --------------------------------------------------------------------------------
    def collect(self, task, groups: Iterable[str]) -> Profile:
        """The task's cumulative profile holding (at least) ``groups``; cost fields: this call only.

        Raises:
            KeyError: an unknown group or one of the other source.
            NcuNotFound, CountersNotPermitted, NoKernelsProfiled, ProgramFailed.
        """
        return self.collect_many([task], groups)[0]

    def collect_many(self, tasks, groups: Iterable[str]) -> list[Profile]:
        """Batch mode: like :meth:`collect` for each task; tasks missing the same groups share a process.

        With ``range_replay_above`` set (ncu), a task whose root group shows more kernels than that gets
        its other groups by range replay, alone in its process; a task missing the root and more first
        gets the root (kernel replay) in a batch of its own, to learn its kernel count.
        """
        tasks = list(tasks)
        wanted = resolve_groups(groups, source=self.source)
        cost: dict[str, tuple[int, float]] = {t.hash: (0, 0.0) for t in tasks}
        unique = list({t.hash: t for t in tasks}.values())
        failures: dict[str, str] = {}
        first_error: ProfilerError | None = None
        if self._range_replay_on() and "root" in wanted:
            missing_now = {t.hash: self._missing_after_cache(t.hash, wanted) for t in unique}
            first = [t for t in unique if len(missing_now[t.hash]) > 1 and "root" in missing_now[t.hash]]
            if first:
                first_error = self._collect_pending({(("root",), "kernel", ""): first}, cost, failures)
        pending: dict[tuple[tuple[str, ...], str, str], list] = {}
        for task in unique:
            if task.hash in failures:
                continue
            missing = self._missing_after_cache(task.hash, wanted)
            if not missing:
                continue
            if missing != ("root",) and self._wants_range_replay(task.hash):
                pending.setdefault((missing, "range", task.hash), []).append(task)  # one task per process
            else:
                pending.setdefault((missing, "kernel", ""), []).append(task)
        first_error = self._collect_pending(pending, cost, failures) or first_error
        if first_error is not None:
            first_error.failures = failures
            raise first_error
        out = []
        for task in tasks:
            passes, seconds = cost[task.hash]
            out.append(replace(self._memory[task.hash], passes=passes, seconds=seconds))
        return out

    def _collect_pending(self, pending: dict, cost: dict, failures: dict) -> ProfilerError | None:
        """Run each batch of ``pending`` ((missing groups, replay mode, tag) -> tasks); add up the cost."""
        first_error: ProfilerError | None = None
        for (missing, replay, _), batch in pending.items():
            try:
                collected, errors = self._run_batch(batch, missing, replay=replay)
            except ProfilerError as exc:
                collected, errors = {}, {t.hash: exc for t in batch}
            for task_hash, profile in collected.items():
                passes, seconds = cost[task_hash]
                cost[task_hash] = (passes + profile.passes, seconds + profile.seconds)
                self._remember(profile)
                if self.cache is not None:
                    self.cache.put(profile, self.environment)
            for task_hash, exc in errors.items():
                failures[task_hash] = first_line(exc, limit=None, empty=type(exc).__name__)
                first_error = first_error or exc
        return first_error

    # --- range replay (tasks with many kernels) -------------------------------------------------------
    def _range_replay_on(self) -> bool:
        return self.source == "ncu" and self.range_replay_above is not None

    def _wants_range_replay(self, task_hash: str) -> bool:
        held = self._memory.get(task_hash)
        if not self._range_replay_on() or held is None:
            return False
        count = held.metrics.get(KERNEL_COUNT)
        return isinstance(count, int | float) and count > self.range_replay_above

    def _from_range(self, profile: Profile) -> Profile:
        """A range-replay profile: range-level metrics; no kernel table; kernel count, summed kernel time
        and launch overhead share taken from the task's kernel-replayed root (its range row knows none)."""
        held = self._memory.get(profile.task_hash)
        metrics = {k: v for k, v in profile.metrics.items() if k not in ROOT_OWNED}
        for name in ROOT_OWNED:
            if held is not None and name in held.metrics and name in profile.metrics:
                metrics[name] = held.metrics[name]
        return replace(profile, metrics=metrics, kernels=[])

    def remember(self, profile: Profile) -> None:
        """Hold an already collected profile (e.g. a recorded root group) as if this profiler had collected
        it: its groups are not collected again, and its kernel count decides range replay."""
        self._remember(replace(profile, passes=0, seconds=0.0))

    def forget(self, task_hash: str | None = None) -> None:
        """Drop in-memory profiles (all, or one task's); the cache is untouched."""
        if task_hash is None:
            self._memory.clear()
        else:
            self._memory.pop(task_hash, None)

    # --- internals ---------------------------------------------------------------------------------
    def _remember(self, profile: Profile) -> None:
        held = self._memory.get(profile.task_hash)
        self._memory[profile.task_hash] = profile if held is None else held.merge(profile)

    def _missing_after_cache(self, task_hash: str, wanted: tuple[str, ...]) -> tuple[str, ...]:
        held = self._memory.get(task_hash)
        missing = [g for g in wanted if held is None or g not in held.groups]
        if missing and self.cache is not None:
            env = self.environment
            hits = self.cache.cached_groups(task_hash, missing, env)  # oldest first
            for group in hits:
                part = self.cache.get_group(task_hash, group, env)
                self._remember(replace(part, passes=0, seconds=0.0))
            missing = [g for g in missing if g not in hits]
        if task_hash not in self._memory and not missing:
            self._memory[task_hash] = Profile(
                task_hash, self.source, frozenset(), {}, device=self.environment.device
            )
        return tuple(missing)

    def _job(self, workdir: Path, tasks, replay: str = "kernel") -> Path:
        (workdir / "tasks").mkdir()
        entries = []
        for task in tasks:
            path = workdir / "tasks" / f"task_{task.hash}.py"
            path.write_text(task.source)
            entries.append({"id": task.hash, "task_id": task.id, "path": str(path.relative_to(workdir))})
        job = {
            "mode": self.source,
            "device": self.device,
            "seed": self.seed,
            "warmup": self.warmup,
            "timing_calls": self.timing_calls,
            "result": "result.json",
            "tasks": entries,
            # range replay replays the whole NVTX range: one range per task (no outer range around it),
            # and the synchronize after it, outside (range replay supports only some CUDA calls inside)
            "range_replay": replay == "range",
        }
        job_path = workdir / "job.json"
        job_path.write_text(json.dumps(job, indent=1))
        return job_path

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["AUTOPROFILER_TASK_SIZE"] = self.task_size
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        return env

    def _capture(self, name: str, text: str) -> None:
        if self.capture_dir is None:
            return
        self.capture_dir.mkdir(parents=True, exist_ok=True)
        (self.capture_dir / name).write_text(text)

    def _execute(
        self, tasks, metrics: list[str] | None, extra_args: tuple[str, ...], tag: str, replay: str = "kernel"
    ) -> tuple:
        """Run the program once for ``tasks``: (ncu table or None, program result, wall seconds).

        ``replay="range"``: ncu with ``--replay-mode range`` over each task's own NVTX range."""
        workdir = Path(tempfile.mkdtemp(prefix="autoprofiler-"))
        start = time.monotonic()
        if replay == "range":
            extra_args = ("--replay-mode", "range", *extra_args)
        try:
            job_path = self._job(workdir, tasks, replay)
            program = [self.python, "-m", "autoprofiler.profiling._program", str(job_path)]
            table = None
            if self.source == "ncu":
                run = ncu_mod.profile_command(
                    program,
                    metrics,
                    workdir=workdir,
                    env=self._env(),
                    timeout_s=self.timeout_s,
                    ncu_path=self.ncu_path,
                    extra_args=extra_args,
                    name_ranges=len(tasks) > 1,
                    nvtx_includes=(
                        (ncu_mod.NVTX_OUTER_RANGE,)
                        if self.nvtx_filter == "outer" and replay == "kernel"
                        else tuple(f"{ncu_mod.TASK_RANGE_PREFIX}{t.hash}" for t in tasks)
                    ),
                )
                self._capture(f"{tag}.csv", run.csv_text)
                table, console = run.table, run.console
            else:
                done = ncu_mod.run_command(
                    program, env=self._env(), timeout_s=self.timeout_s, cwd=str(workdir)
                )
                console = done.stdout + done.stderr
                if done.returncode != 0:
                    raise ProgramFailed(
                        f"profiled program exited with code {done.returncode}\n{ncu_mod.tail(console)}"
                    )
            result = self._read_result(workdir, console)
            self._capture(f"{tag}.result.json", json.dumps(result, indent=1))
            seconds = time.monotonic() - start
            _log_program_seconds(result, seconds)
            return table, result, seconds
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def measure(self, tasks, metrics: list[str] | None = None, extra_args: tuple[str, ...] = ()) -> dict:
        """One ncu process over ``tasks`` with raw ``--metrics`` or e.g. ``extra_args=("--set", "full")``.

        For cost benchmarks: nothing is cached or remembered. Returns ``{"seconds": wall of the run,
        "tasks": {hash: {"passes", "kernels", "kernel_ns", "wall_us", "ok"}}}``.
        """
        if self.source != "ncu":
            raise ValueError("measure() runs ncu: use a Profiler with source='ncu'")
        tasks = list(tasks)
        tag = f"measure_{'+'.join(extra_args).replace('-', '') or len(metrics or [])}__{tasks[0].hash}"
        table, result, seconds = self._execute(tasks, metrics, tuple(extra_args), tag)
        by_task = ncu_mod.split_by_task(table, [t.hash for t in tasks])
        out = {}
        for task in tasks:
            rows = by_task[task.hash]
            entry = result["tasks"].get(task.hash, {})
            out[task.hash] = {
                "id": task.id,
                "passes": ncu_mod.kernel_passes(rows),
                "kernels": len(rows),
                "kernel_ns": sum(r.get("gpu__time_duration.sum") or 0.0 for r in rows),
                "wall_us": entry.get("wall_us"),
                "ok": bool(entry.get("ok")) and bool(rows),
            }
        self.runs.append(RunRecord(tuple(t.hash for t in tasks), ("measure",), seconds, True))
        return {"seconds": seconds, "tasks": out}

    def _run_batch(
        self, tasks, groups: tuple[str, ...], replay: str = "kernel"
    ) -> tuple[dict[str, Profile], dict[str, Exception]]:
        """One process for ``tasks``; returns (profiles, per-task errors). Raises on whole-run failures."""
        start = time.monotonic()
        ok = False
        try:
            tag = f"{'+'.join(groups)}__{replay}__{'+'.join(t.hash for t in tasks)[:120]}"
            metrics = ncu_request_metrics(groups, replay) if self.source == "ncu" else None
            table, result, seconds = self._execute_learning(tasks, metrics, tag, replay)
            seconds /= len(tasks)
            profiles, errors = {}, {}
            by_task = ncu_mod.split_by_task(table, [t.hash for t in tasks]) if table is not None else {}
            for task in tasks:
                entry = result["tasks"].get(task.hash)
                if entry is None or not entry.get("ok"):
                    reason = "did not run" if entry is None else entry.get("error", "failed")
                    errors[task.hash] = ProgramFailed(f"task {task.id} ({task.hash}): {reason}")
                    continue
                if self.source == "ncu":
                    rows = by_task[task.hash]
                    if not rows:
                        errors[task.hash] = NoKernelsProfiled(
                            f"task {task.id} ({task.hash}): no kernel in its NVTX range ap:{task.hash}"
                        )
                        continue
                    profiles[task.hash] = profile_from_kernels(
                        task.hash,
                        rows,
                        groups,
                        table.units,
                        wall_us=entry.get("wall_us"),
                        passes=ncu_mod.kernel_passes(rows),
                        seconds=seconds,
                        device=self.environment.device,
                    )
                    if replay == "range":
                        profiles[task.hash] = self._from_range(profiles[task.hash])
                else:
                    profiles[task.hash] = profile_from_torch_result(
                        task.hash,
                        entry,
                        groups,
                        device=self.device,
                        device_name=self.environment.device,
                        seconds=seconds,
                    )
            ok = not errors
            return profiles, errors
        finally:
            self.runs.append(RunRecord(tuple(t.hash for t in tasks), groups, time.monotonic() - start, ok))

    def _execute_learning(self, tasks, metrics: list[str] | None, tag: str, replay: str) -> tuple:
        """``_execute``; under range replay, a metric ncu says it cannot collect over a range is dropped
        (remembered in ``range_dropped`` for this profiler's later runs) and the run made again."""
        if replay != "range" or metrics is None:
            return self._execute(tasks, metrics, (), tag, replay)
        metrics = [m for m in metrics if m not in self.range_dropped]
        for _ in range(RANGE_RETRIES):
            try:
                return self._execute(tasks, metrics, (), tag, replay)
            except ProgramFailed as exc:
                named = [m for m in ncu_mod.range_unsupported(str(exc)) if m in metrics]
                if not named or named == [DURATION_METRIC]:
                    raise
                log.warning("range replay: ncu cannot collect %s over a range; dropped", ", ".join(named))
                self.range_dropped.update(named)
                metrics = [m for m in metrics if m not in named]
        return self._execute(tasks, metrics, (), tag, replay)

    @staticmethod
    def _read_result(workdir: Path, console: str) -> dict:
        path = workdir / "result.json"
        if not path.exists():
            raise ProgramFailed(f"the profiled program wrote no result ({path})\n{ncu_mod.tail(console)}")
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            raise ProgramFailed(f"unreadable program result {path}: {exc}") from exc


def known_groups(source: str) -> list[str]:
    """Names of the groups of one source, in catalog order."""
    return [name for name, group in GROUPS.items() if group.source == source]


def _log_program_seconds(result: dict, wall: float) -> None:
    """Where one profiled run's wall time went, as the program measured it (INFO)."""
    tasks = [t for t in result.get("tasks", {}).values() if isinstance(t, dict)]
    parts = {k: sum(float(t.get(k) or 0.0) for t in tasks) for k in ("setup_s", "calls_s", "profiled_s")}
    log.info(
        "profiled run of %d task(s): %.1f s; in the program: start %.1f s, building and inputs %.1f s, "
        "warm-up and timing calls %.1f s, profiled calls %.1f s",
        len(tasks),
        wall,
        float(result.get("start_s") or 0.0),
        parts["setup_s"],
        parts["calls_s"],
        parts["profiled_s"],
    )
