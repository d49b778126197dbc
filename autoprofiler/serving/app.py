"""The Ray Serve application: the ``Service`` ingress (HTTP API) and the ``Optimizer`` (jobs + workers).

    serve run serve_config.yaml                # import_path: autoprofiler.serving.app:build
    python workflows/serve.py                  # the same config, started from Python

``Service`` answers HTTP (``autoprofiler.serving.api``): it holds the served tree, routes in-process
(numbers only) and scales with replicas. ``Optimizer`` is one replica holding the ``/optimize`` job board
and ``GpuWorker`` actors (``CellWorker`` via ``RayDriver.start``: ``max_restarts=-1``): a job profiles
the task by the tree, rewrites once and evaluates it on a worker (``CellWorker.optimize``), so submitted
code runs only in the workers' profiler subprocesses and sandboxed evaluators, never in a replica.

Hot reload: ``PUT /tree``, or a new ``user_config: {tree: ...}`` on the ``Service`` deployment
(``serve deploy``), which Serve applies in place through ``Service.reconfigure``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from ray import serve

from autoprofiler.serving.api import ServiceCore, make_api
from autoprofiler.serving.jobs import Job, JobBoard, JobsFull, WorkerLost
from autoprofiler.serving.routing import ServedTree, load_served_tree
from autoprofiler.serving.settings import ServeSettings, check_binding, settings_from_args
from autoprofiler.text import first_line

__all__ = ["Optimizer", "Service", "build", "build_app", "serve_host"]

logger = logging.getLogger(__name__)

#: Serve options of the ingress: bounded concurrency, overload answered 503 by Serve's proxy.
SERVICE_OPTIONS = {"max_ongoing_requests": 128, "max_queued_requests": 256}
#: How long a job waits for its worker to come back after a restart before it fails (502).
WORKER_START_S = 300.0


def serve_host() -> str | None:
    """The host Serve's HTTP proxy binds (``http_options.host``), or ``None`` when it cannot be read."""
    try:
        from ray.serve._private.api import _get_global_client  # no public API gives the bound host

        return _get_global_client().http_config.host
    except Exception as exc:  # an unknown host counts as non-loopback: the token check fails closed
        logger.warning("cannot read Serve's HTTP host: %s", exc)
        return None


class _OptimizerHandle:
    """``api.OptimizeBackend`` over a Serve handle to the ``Optimizer`` deployment."""

    def __init__(self, handle):
        self.handle = handle

    async def submit(self, task, served: ServedTree, seed: int, trials: int | None) -> tuple[int, dict]:
        return await self.handle.submit.remote(task, served.tree, served.hash, seed, trials)

    async def state(self, job_id: str) -> tuple[int, dict] | None:
        return await self.handle.state.remote(job_id)


@serve.deployment(ray_actor_options={"num_cpus": 0}, **SERVICE_OPTIONS)
@serve.ingress()
class Service:
    """The HTTP ingress. Refuses to start on a non-loopback host without a token."""

    def __init__(self, settings: ServeSettings, optimizer=None):
        host = serve_host()
        check_binding(host or "(unknown host)", settings.token)
        context = serve.get_replica_context()
        identity = {"replica": context.replica_id.unique_id, "started_at": time.time()}
        backend = _OptimizerHandle(optimizer) if optimizer is not None else None
        self.core = ServiceCore(settings, backend, identity)

    def reconfigure(self, user_config: Mapping[str, Any] | None) -> None:
        self.core.reconfigure(user_config)

    def __serve_build_asgi_app__(self):
        return make_api(self.core)


@serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=1, max_ongoing_requests=1000)
class Optimizer:
    """The ``/optimize`` job board and its ``GpuWorker`` actors (one replica: jobs live here)."""

    def __init__(self, settings: ServeSettings, source: str):
        from autoprofiler.runtime.ray_driver import RayDriver

        spec = settings.worker_spec(source)
        self.driver = RayDriver.start(
            spec, num_workers=settings.workers, num_cpus_per_worker=settings.worker_cpus, progress=None
        )
        self.load = [0] * len(self.driver.workers)
        capacity = len(self.driver.workers) * spec.concurrency
        self.board = JobBoard(self._run, capacity, settings.max_jobs, settings.keep_jobs)

    async def _run(self, job: Job):
        from ray.exceptions import RayActorError

        w = min(range(len(self.load)), key=self.load.__getitem__)
        self.load[w] += 1
        try:
            await self._ready(w)
            results = await self.driver.workers[w].optimize.remote([job.task], job.tree, job.seed, job.trials)
        except RayActorError as exc:
            reason = first_line(exc)
            raise WorkerLost(
                f"worker {w} died mid-request ({type(exc).__name__}: {reason}); Ray restarts it: submit "
                "the task again"
            ) from None
        finally:
            self.load[w] -= 1
        return results[0]

    async def _ready(self, w: int) -> None:
        """Wait while worker ``w`` restarts (after a death Ray refuses calls until ``__init__`` is done)."""
        from ray.exceptions import ActorUnavailableError

        deadline = time.monotonic() + WORKER_START_S
        while True:
            try:
                await self.driver.workers[w].info.remote()
                return
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)

    async def submit(self, task, tree, tree_hash: str, seed: int, trials: int | None) -> tuple[int, dict]:
        """(202, accepted job) or (503, why) when ``max_jobs`` are pending."""
        try:
            job = self.board.submit(task, tree, tree_hash, seed, trials)
        except JobsFull as exc:
            return 503, {"detail": str(exc)}
        accepted = {"id": job.id, "status": job.status, "poll": f"/optimize/{job.id}"}
        return 202, {**accepted, "task_hash": task.hash, "tree": tree_hash}

    async def state(self, job_id: str) -> tuple[int, dict] | None:
        job = self.board.get(job_id)
        return None if job is None else (job.http_status, job.state())

    async def workers(self) -> list[dict[str, Any]]:
        """Each worker's ``info()`` (pid, host, device): for operators and tests."""
        return list(await asyncio.gather(*[w.info.remote() for w in self.driver.workers]))

    def __del__(self):
        try:
            self.driver.close()
        except Exception as exc:  # the cluster may already be going down
            logger.warning("closing optimize workers: %s", exc)


def build_app(
    settings: ServeSettings,
    service_options: Mapping[str, Any] | None = None,
    optimizer_options: Mapping[str, Any] | None = None,
):
    """The Serve application of ``settings`` (``Service``, plus ``Optimizer`` when ``workers > 0``).

    ``service_options`` / ``optimizer_options``: Serve deployment options (``max_ongoing_requests``,
    ``max_queued_requests``, ``num_replicas``, ``user_config``, ...) over the defaults.
    """
    source = load_served_tree(settings.tree).tree.source
    optimizer = None
    if settings.workers > 0:
        optimizer = Optimizer.options(**dict(optimizer_options or {})).bind(settings, source)
    return Service.options(**dict(service_options or {})).bind(settings, optimizer)


def build(args: Mapping[str, Any] | None = None):
    """The app builder ``serve run`` / ``serve deploy`` call with the config's ``args``.

    Raises ``SettingsError`` naming every bad key or value.
    """
    return build_app(settings_from_args(args))
