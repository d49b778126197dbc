"""Drivers: fan work items out to workers and gather what comes back, in order.

Two drivers share one interface (``Runner``), so environments do not care where work runs:

- ``LocalDriver``: one worker in this process (tests, one task from the CLI, a machine without Ray).
- ``RayDriver``: one ``GpuWorker`` actor per GPU (or CPU workers on a laptop or CI), a bounded number of
  batches in flight per worker (backpressure), a progress bar with rate and ETA, and fault tolerance: a
  worker that dies is restarted by Ray and the cells of its lost batches are resubmitted (a batch that
  died is split into single cells, so a cell that kills its worker every time is isolated and given up
  after ``max_attempts``). Results are keyed by cell, so a resubmitted cell is never counted twice.

Example (no Ray)::

    driver = LocalDriver(CellWorker(WorkerSpec(device="cpu", task_size="small", source="torch")))
    rows = driver.run_cells([WorkItem(cell)])
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from autoprofiler.cells import CellFailure, RewardRow, WorkItem
from autoprofiler.provenance import Provenance
from autoprofiler.runtime.progress import Progress

if TYPE_CHECKING:
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.tasks import Task

__all__ = ["BatchClock", "LocalDriver", "Runner"]

logger = logging.getLogger(__name__)

CellResult = RewardRow | CellFailure


class Runner(Protocol):
    """Where an environment's cells run and its tasks get profiled."""

    def run_cells(
        self,
        items: Sequence[WorkItem],
        deadline: float | None = None,
        on_result: Callable[[CellResult], None] | None = None,
    ) -> list[CellResult]:
        """One result per item, in order. ``deadline`` (``time.monotonic()``): a batch starts only if the
        longest batch this runner has run would still end by then (``BatchClock``); the items of batches
        not started are ``CellFailure(kind="not_started")``. ``on_result`` is called as each result
        arrives."""
        ...

    def profile(
        self, tasks: Sequence[Task], groups: Sequence[str], held: Sequence[Profile | None] = ()
    ) -> list[Profile | CellFailure]: ...

    def provenance(self) -> Provenance:
        """Where the workers measure: device, driver, profiler tool, torch, code."""
        ...

    def close(self) -> None: ...


class BatchClock:
    """The longest batch a driver has run, so that no batch starts that would end past a deadline.

    A deadline usually comes from a hard limit outside the run (a device call killed at its end), so a
    batch started just before it is lost with its work; judging by the longest batch so far (across
    calls: retries come in calls of their own) keeps every started batch inside the budget. The first
    batch always starts before the deadline: nothing is known yet. Thread-safe.
    """

    def __init__(self) -> None:
        self.longest = 0.0
        self._lock = threading.Lock()

    def fits(self, deadline: float | None) -> bool:
        """Whether a batch started now would end by ``deadline`` (always, without one)."""
        return deadline is None or time.monotonic() + self.longest <= deadline

    def ran(self, seconds: float) -> None:
        with self._lock:
            self.longest = max(self.longest, seconds)


def not_started(item: WorkItem) -> CellFailure:
    return CellFailure(item.cell.key, "not_started", f"{item.cell.describe()}: the run stopped before it")


class LocalDriver:
    """Runs a worker's methods in this process, one batch at a time (see the module docstring).

    Args:
        worker: a ``CellWorker`` or ``ReplayWorker``.
        batch_size: cells per call of ``worker.run_cells``.
        progress: show a progress bar for calls of at least this many cells (``None``: never).
        concurrency: batches run at once, each in a thread (as a Ray actor's ``max_concurrency``
            does): a ``CellWorker`` built with the same concurrency compiles and checks that many
            candidates at once while its timing lock keeps measurements one at a time.
    """

    def __init__(self, worker: Any, batch_size: int = 1, progress: int | None = None, concurrency: int = 1):
        self.worker = worker
        self.batch_size = max(1, int(batch_size))
        self.progress = progress
        self.concurrency = max(1, int(concurrency))
        self.clock = BatchClock()

    def run_cells(
        self,
        items: Sequence[WorkItem],
        deadline: float | None = None,
        on_result: Callable[[CellResult], None] | None = None,
    ) -> list[CellResult]:
        batches = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]

        def run(batch: Sequence[WorkItem]) -> list[CellResult]:
            if not self.clock.fits(deadline):
                return [not_started(i) for i in batch]
            started = time.monotonic()
            results = self.worker.run_cells(batch)
            self.clock.ran(time.monotonic() - started)
            return results

        out: list[CellResult] = []
        show = self.progress is not None and len(items) >= self.progress
        # one at a time in this thread; with concurrency > 1, in threads (results still in order)
        pool = ThreadPoolExecutor(self.concurrency) if self.concurrency > 1 else None
        with Progress(len(items), "cells", enabled=show) as bar, pool or contextlib.nullcontext():
            answers = pool.map(run, batches) if pool is not None else map(run, batches)
            for batch, results in zip(batches, answers, strict=True):
                for result in results:
                    if on_result is not None:
                        on_result(result)
                out.extend(results)
                bar.update(len(batch))
        return out

    def profile(
        self, tasks: Sequence[Task], groups: Sequence[str], held: Sequence[Profile | None] = ()
    ) -> list[Profile | CellFailure]:
        return self.worker.profile(tasks, groups, held)

    def provenance(self) -> Provenance:
        return self.worker.provenance

    def close(self) -> None:
        self.worker.close()


#: how long ``fan_out`` waits for a lost worker to answer its ping before it submits to it again anyway
#: (its next calls then fail, and count, if Ray never brings it back)
RESTART_WAIT_S = 300.0


def fan_out(
    batches: Sequence[Sequence[Any]],
    submit: Callable[[int, Sequence[Any]], Any],
    workers: int,
    per_worker: int,
    on_done: Callable[[Sequence[Any], list[Any]], None],
    on_lost: Callable[[Sequence[Any], Exception], Sequence[Sequence[Any]]],
    deadline: float | None = None,
    on_skip: Callable[[Sequence[Any]], None] | None = None,
    clock: BatchClock | None = None,
    ping: Callable[[int], Any] | None = None,
) -> None:
    """Submit ``batches`` to ``workers`` with at most ``per_worker`` in flight each; gather as they end.

    ``submit(worker index, batch)`` returns a Ray object ref. ``on_done(batch, results)`` takes a batch's
    results. When a call fails because its worker died (``RayActorError``), ``on_lost(batch, error)``
    returns the batches to submit again (possibly none), and the worker gets nothing new until Ray has
    restarted it: until ``ping(worker index)`` (a cheap call, returning a ref) answers, asked again each
    second for up to ``RESTART_WAIT_S`` (without ``ping``: after a one-second rest). So a batch is lost
    only to a worker that was running it, never to one still restarting (a restart re-runs the worker's
    ``__init__``, which on a busy node takes seconds). Once a batch would no longer end by ``deadline``
    (judged by ``clock``, which learns each finished batch's time from submission to result) nothing new
    is submitted and ``on_skip(batch)`` gets the rest.
    """
    import ray
    from ray.exceptions import ActorUnavailableError, RayActorError

    queue = deque(batches)
    clock = clock or BatchClock()
    in_flight: dict[Any, tuple[int, Sequence[Any], float]] = {}
    load = [0] * workers
    resting_until = [0.0] * workers
    lost_at: list[float | None] = [None] * workers  # when a worker was lost, until it answers a ping
    pinging: dict[Any, int] = {}
    while queue or in_flight:
        now = time.monotonic()
        if not clock.fits(deadline):
            while queue:
                batch = queue.popleft()
                if on_skip is not None:
                    on_skip(batch)
        for w, since in enumerate(lost_at):
            if since is not None and now - since > RESTART_WAIT_S:
                lost_at[w] = None  # submit again: its calls fail, and count, if it never returns
            elif since is not None and w not in pinging.values() and resting_until[w] <= now:
                pinging[ping(w)] = w
        while queue:
            ready = [
                w
                for w in range(workers)
                if load[w] < per_worker and resting_until[w] <= now and lost_at[w] is None
            ]
            if not ready:
                break
            w = min(ready, key=lambda i: load[i])
            batch = queue.popleft()
            in_flight[submit(w, batch)] = (w, batch, time.monotonic())
            load[w] += 1
        if not in_flight and not pinging:
            time.sleep(0.1)  # every worker is resting after a death
            continue
        done, _ = ray.wait([*in_flight, *pinging], num_returns=1, timeout=1.0)
        for ref in done:
            if ref in pinging:
                w = pinging.pop(ref)
                try:
                    ray.get(ref)
                    lost_at[w] = None  # restarted
                except ActorUnavailableError:
                    resting_until[w] = time.monotonic() + 1.0  # still restarting: ask again
                except RayActorError:
                    lost_at[w] = None  # gone for good: its calls fail, and count
                continue
            w, batch, submitted = in_flight.pop(ref)
            load[w] -= 1
            try:
                results = ray.get(ref)
            except RayActorError as exc:
                logger.warning(
                    "worker %d died during a batch of %d (%s); resubmitting",
                    w,
                    len(batch),
                    type(exc).__name__,
                )
                resting_until[w] = time.monotonic() + 1.0
                if ping is not None and lost_at[w] is None:
                    lost_at[w] = time.monotonic()
                queue.extendleft(reversed(list(on_lost(batch, exc))))
                continue
            clock.ran(time.monotonic() - submitted)
            on_done(batch, results)
