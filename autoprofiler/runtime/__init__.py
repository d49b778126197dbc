"""The runtime: workers that turn cells into rows and tasks into profiles, and drivers that fan work out.

``CellWorker`` (one device's evaluator pool, profiler and rewriter) and ``ReplayWorker`` (a recording)
answer the same two methods; ``LocalDriver`` runs one in this process, ``RayDriver`` one actor per GPU.
"""

from autoprofiler.runtime.driver import LocalDriver, Runner
from autoprofiler.runtime.worker import CellWorker, ReplayWorker, TaskProfiler, WorkerSpec

__all__ = ["CellWorker", "LocalDriver", "ReplayWorker", "Runner", "TaskProfiler", "WorkerSpec"]
