"""The Ray runtime: ``GpuWorker`` actors (one per GPU) and the ``RayDriver`` that fans cells out to them.

    init_ray()                                        # joins RAY_ADDRESS (ray job submit), else starts local
    driver = RayDriver.start(WorkerSpec(device="cuda", source="ncu", concurrency=4))   # one actor per GPU
    rows = driver.run_cells(items)                    # RewardRow | CellFailure per item, in order
    driver.close()

Each actor is a ``CellWorker``: it builds its evaluator pool, profiler and rewriter in ``__init__`` and
takes batches of cells. ``max_restarts=-1`` and ``max_task_retries=0``: Ray restarts a dead actor (its
``__init__`` again), and the driver, not Ray, decides what to resubmit (``driver.fan_out``), so a cell
that kills its worker is isolated instead of killing it again and again.

Imports Ray lazily: the rest of the package loads on a machine without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autoprofiler.cells import CellFailure, WorkItem
from autoprofiler.provenance import Provenance
from autoprofiler.runtime.driver import BatchClock, CellResult, fan_out, not_started
from autoprofiler.runtime.progress import Progress
from autoprofiler.runtime.worker import CellWorker, ReplayWorker, WorkerSpec

if TYPE_CHECKING:
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.tasks import Task

__all__ = ["RayDriver", "init_ray", "cluster_gpus"]

logger = logging.getLogger(__name__)


def init_ray(num_cpus: int | None = None, quiet: bool = True) -> None:
    """Join the cluster named by ``RAY_ADDRESS`` (set by ``ray job submit``), else start a local one.

    A local start counts ``num_cpus`` (default: this machine's) and leaves the dashboard off.
    """
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=not quiet)
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=not quiet)


def cluster_gpus() -> int:
    """GPUs the running Ray cluster has (0 on a CPU machine)."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def _actor_class(worker_class: type, spec: WorkerSpec, num_gpus: float, num_cpus: float):
    import ray

    return ray.remote(worker_class).options(
        num_gpus=num_gpus,
        num_cpus=num_cpus,
        scheduling_strategy="SPREAD",  # workers hold no CPU: spread them over the nodes explicitly
        max_restarts=-1,
        max_task_retries=0,
        max_concurrency=spec.concurrency,
    )


class RayDriver:
    """Fans batches of cells (and of tasks to profile) out to Ray actors (see the module docstring).

    Args:
        workers: actor handles of ``CellWorker`` (``GpuWorker``) or ``ReplayWorker``.
        concurrency: batches in flight per worker (the actors' ``max_concurrency``).
        batch_size: cells per call; profiling goes ``profile_batch`` tasks per call.
        max_attempts: runs of one cell whose worker died each time before it is given up.
        progress: show a progress bar for calls of at least this many cells (``None``: never).
    """

    def __init__(
        self,
        workers: Sequence[Any],
        concurrency: int = 1,
        batch_size: int = 1,
        profile_batch: int = 8,
        max_attempts: int = 3,
        progress: int | None = 20,
    ):
        if not workers:
            raise ValueError("a RayDriver needs at least one worker")
        self.workers = list(workers)
        self.concurrency = max(1, int(concurrency))
        self.batch_size = max(1, int(batch_size))
        self.profile_batch = max(1, int(profile_batch))
        self.max_attempts = max(1, int(max_attempts))
        self.progress = progress
        self.lost_batches = 0
        self.clock = BatchClock()  # the longest cell batch so far, against run_cells' deadline
        self._provenance: Provenance | None = None

    @classmethod
    def start(
        cls,
        spec: WorkerSpec,
        num_workers: int | None = None,
        num_gpus_per_worker: float | None = None,
        num_cpus_per_worker: float | None = None,
        **driver_options: Any,
    ) -> RayDriver:
        """Start ``num_workers`` ``GpuWorker`` actors (default: one per GPU on CUDA, else one).

        Each holds one GPU when ``spec.device`` is CUDA (``num_gpus_per_worker``, default 1), none on CPU,
        and ``num_cpus_per_worker`` CPUs (default 0). A worker's own process only hands cells to its
        sandboxed subprocesses, whose CPU use Ray does not count either way; a CPU held per worker would
        leave the driver's Ray Data table writes none once there are as many workers as CPUs (two
        workers on two CPUs: the sweep waited for its first write for ever). Workers are spread over
        the cluster's nodes.
        """
        if num_cpus_per_worker is None:
            num_cpus_per_worker = 0.0
        cuda = spec.device.startswith("cuda")
        if num_gpus_per_worker is None:
            num_gpus_per_worker = 1.0 if cuda else 0.0
        if num_workers is None:
            num_workers = max(1, cluster_gpus()) if cuda else 1
        if cuda and num_gpus_per_worker and cluster_gpus() < num_workers * num_gpus_per_worker:
            raise RuntimeError(
                f"{num_workers} CUDA worker(s) need {num_workers * num_gpus_per_worker:g} GPUs; the Ray "
                f"cluster has {cluster_gpus()}"
            )
        actor = _actor_class(CellWorker, spec, num_gpus_per_worker, num_cpus_per_worker)
        workers = [actor.remote(spec) for _ in range(num_workers)]
        return cls(workers, concurrency=spec.concurrency, **driver_options)

    @classmethod
    def start_replay(
        cls,
        recording: str | Sequence[str],
        source: str | None = None,
        num_workers: int = 1,
        **driver_options: Any,
    ) -> RayDriver:
        """``num_workers`` ``ReplayWorker`` actors answering from a recording, or from the union of several
        (no GPU, no CPU held)."""
        import ray

        actor = ray.remote(ReplayWorker).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
        workers = [actor.remote(recording, source) for _ in range(num_workers)]
        driver_options.setdefault("batch_size", 256)
        return cls(workers, **driver_options)

    def info(self) -> list[dict[str, Any]]:
        """Each worker's ``info()`` (pid, host, device, provenance)."""
        import ray

        return ray.get([w.info.remote() for w in self.workers])

    def provenance(self) -> Provenance:
        """The first worker's provenance (workers of one run share code and, on one cluster, hardware)."""
        if self._provenance is None:
            self._provenance = self.info()[0]["provenance"]
        return self._provenance

    # --- cells -------------------------------------------------------------------------------------
    def run_cells(
        self,
        items: Sequence[WorkItem],
        deadline: float | None = None,
        on_result: Callable[[CellResult], None] | None = None,
    ) -> list[CellResult]:
        index = {item.cell.key: i for i, item in enumerate(items)}
        out: list[CellResult | None] = [None] * len(items)
        attempts: dict[str, int] = {}
        batches = [list(items[i : i + self.batch_size]) for i in range(0, len(items), self.batch_size)]
        show = self.progress is not None and len(items) >= self.progress

        with Progress(len(items), "cells", enabled=show) as bar:

            def place(item: WorkItem, result: CellResult) -> None:
                i = index[item.cell.key]
                if out[i] is None:
                    out[i] = result
                    bar.update(1)
                    if on_result is not None:
                        on_result(result)

            def done(batch, results) -> None:
                for item, result in zip(batch, results, strict=True):
                    place(item, result)

            def lost(batch, error) -> list[list[WorkItem]]:
                self.lost_batches += 1
                again = []
                for item in batch:
                    attempts[item.cell.key] = attempts.get(item.cell.key, 0) + 1
                    if attempts[item.cell.key] >= self.max_attempts:
                        place(
                            item,
                            CellFailure(
                                item.cell.key,
                                "worker_lost",
                                f"{item.cell.describe()}: its worker died {self.max_attempts} "
                                f"times ({type(error).__name__})",
                            ),
                        )
                    else:
                        again.append([item])  # alone from now on: a cell that kills its worker is isolated
                return again

            def skip(batch) -> None:
                for item in batch:
                    place(item, not_started(item))

            fan_out(
                batches,
                lambda w, batch: self.workers[w].run_cells.remote(batch),
                len(self.workers),
                self.concurrency,
                done,
                lost,
                deadline,
                skip,
                self.clock,
                ping=lambda w: self.workers[w].info.remote(),
            )
        return [r if r is not None else not_started(item) for r, item in zip(out, items, strict=True)]

    # --- profiles ----------------------------------------------------------------------------------
    def profile(
        self, tasks: Sequence[Task], groups: Sequence[str], held: Sequence[Profile | None] = ()
    ) -> list[Profile | CellFailure]:
        held = list(held) or [None] * len(tasks)
        out: dict[str, Profile | CellFailure] = {}
        attempts: dict[str, int] = {}
        pairs = list(zip(tasks, held, strict=True))
        batches = [pairs[i : i + self.profile_batch] for i in range(0, len(pairs), self.profile_batch)]
        show = self.progress is not None and len(tasks) >= self.progress

        with Progress(len(tasks), "profiles", enabled=show, unit="task") as bar:

            def done(batch, results) -> None:
                for (task, _), result in zip(batch, results, strict=True):
                    out[task.hash] = result
                bar.update(len(batch))

            def lost(batch, error) -> list:
                again = []
                for task, h in batch:
                    attempts[task.hash] = attempts.get(task.hash, 0) + 1
                    if attempts[task.hash] >= self.max_attempts:
                        out[task.hash] = CellFailure(
                            task.hash,
                            "worker_lost",
                            f"{task.id}: its profiling worker died {self.max_attempts} times",
                        )
                        bar.update(1)
                    else:
                        again.append([(task, h)])
                return again

            fan_out(
                batches,
                lambda w, batch: self.workers[w].profile.remote(
                    [t for t, _ in batch], list(groups), [h for _, h in batch]
                ),
                len(self.workers),
                1,  # one profiled process at a time per GPU: ncu owns the device while it replays
                done,
                lost,
                ping=lambda w: self.workers[w].info.remote(),
            )
        return [out[t.hash] for t in tasks]

    def close(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.get(w.close.remote(), timeout=30)
            except Exception as exc:  # a dead or hung worker: kill it anyway
                logger.warning("worker close failed: %s", exc)
            ray.kill(w)
        self.workers = []
