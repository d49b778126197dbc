"""``/optimize`` jobs: a bounded board of asynchronous jobs, each one task optimized on a worker.

``POST /optimize`` submits a job and answers its id at once; ``GET /optimize/{id}`` polls it. The board
knows nothing of Ray: it is handed ``run(job) -> Optimized`` (in the Serve app, a call of
``CellWorker.optimize`` on a ``GpuWorker`` actor) and how many jobs may run at once::

    board = JobBoard(run, capacity=1, max_jobs=16, keep_jobs=256)
    job = board.submit(task, tree, tree_hash, seed=0, trials=None)   # JobsFull when 16 are pending
    board.get(job.id).state()          # {"status": "queued" | "running" | "done" | "failed", ...}

A job whose worker died raises ``WorkerLost`` from ``run``: the job fails with HTTP status 502 and the
reason; any other exception fails it with 500. A task the worker could not profile or evaluate is not a
machinery failure: the job is ``done`` and its result says why (``failed: true``, ``error``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoprofiler.optimize import Optimized
    from autoprofiler.tasks import Task
    from autoprofiler.tree import ProfilingTree

__all__ = ["Job", "JobBoard", "JobsFull", "WorkerLost", "job_result"]

logger = logging.getLogger(__name__)


class JobsFull(RuntimeError):
    """The board already holds ``max_jobs`` queued or running jobs (answered 503)."""


class WorkerLost(RuntimeError):
    """The worker running a job died mid-request (answered 502 with this reason)."""


@dataclass
class Job:
    """One ``/optimize`` request. ``http_status``: 200 while pending or done, 5xx once failed."""

    id: str
    task: Task
    tree: ProfilingTree
    tree_hash: str
    seed: int = 0
    trials: int | None = None
    status: str = "queued"
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    http_status: int = 200
    _runner: asyncio.Task | None = field(default=None, repr=False)

    def state(self) -> dict[str, Any]:
        """The job as ``GET /optimize/{id}`` answers it (``models.JobState``)."""
        return {
            "id": self.id,
            "status": self.status,
            "task_id": self.task.id,
            "task_hash": self.task.hash,
            "tree": self.tree_hash,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "result": self.result,
            "error": self.error,
        }


def job_result(optimized: Optimized) -> dict[str, Any]:
    """A done job's answer: ``optimize.result_row`` plus the candidate source, rewriter and policy."""
    from autoprofiler.optimize import result_row

    row = optimized.row
    return {
        **result_row(optimized),
        "candidate_source": row.candidate_source if row else None,
        "rewriter": row.rewriter if row else "",
        "policy": row.policy if row else "",
        "profile_passes": row.profile_passes if row else optimized.passes,
        "profile_seconds": row.profile_seconds if row else optimized.profile_seconds,
    }


class JobBoard:
    """Bounded asynchronous jobs (see the module docstring). Use from one event loop.

    Args:
        run: ``await run(job)`` optimizes ``job.task`` and returns its ``Optimized``.
        capacity: jobs running at once (workers x their concurrency); the others wait ``queued``.
        max_jobs: queued + running jobs at most; ``submit`` raises ``JobsFull`` beyond.
        keep_jobs: finished jobs kept for polling; the oldest are forgotten first.
    """

    def __init__(
        self,
        run: Callable[[Job], Awaitable[Optimized]],
        capacity: int = 1,
        max_jobs: int = 16,
        keep_jobs: int = 256,
    ):
        self._run = run
        self._slots = asyncio.Semaphore(max(1, capacity))
        self.max_jobs = max_jobs
        self.keep_jobs = keep_jobs
        self._pending: dict[str, Job] = {}
        self._finished: OrderedDict[str, Job] = OrderedDict()

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        return len(self._pending)

    def submit(
        self, task: Task, tree: ProfilingTree, tree_hash: str, seed: int = 0, trials: int | None = None
    ) -> Job:
        """Queue a job and start it in the background; ``JobsFull`` when ``max_jobs`` are pending."""
        if len(self._pending) >= self.max_jobs:
            raise JobsFull(f"{len(self._pending)} optimize jobs are queued or running (max_jobs)")
        job = Job(uuid.uuid4().hex, task, tree, tree_hash, seed, trials)
        self._pending[job.id] = job
        job._runner = asyncio.get_running_loop().create_task(self._execute(job))
        return job

    def get(self, job_id: str) -> Job | None:
        """The job, pending or finished; ``None`` when unknown or forgotten."""
        return self._pending.get(job_id) or self._finished.get(job_id)

    async def _execute(self, job: Job) -> None:
        try:
            async with self._slots:
                job.status, job.started_at = "running", time.time()
                optimized = await self._run(job)
            job.result, job.status = job_result(optimized), "done"
        except WorkerLost as exc:
            job.status, job.error, job.http_status = "failed", str(exc), 502
        except asyncio.CancelledError:
            job.status, job.error, job.http_status = "failed", "the service shut down during the job", 503
            raise
        except Exception as exc:  # the machinery failed: a 5xx with the reason, never a silent drop
            logger.exception("optimize job %s failed", job.id)
            job.status, job.error, job.http_status = "failed", f"{type(exc).__name__}: {exc}"[:2000], 500
        finally:
            job.finished_at = time.time()
            self._pending.pop(job.id, None)
            self._finished[job.id] = job
            job._runner = None
            while len(self._finished) > self.keep_jobs:
                self._finished.popitem(last=False)
