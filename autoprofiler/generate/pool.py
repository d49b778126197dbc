"""A pool of worker processes that run generated tasks (``_worker.py``), each job under a time limit.

The driver never executes task code: it writes jobs to the workers' stdin and reads one JSON line per
job back. A job past its time limit gets its worker's process group killed and a ``timeout`` result; a
worker that dies mid-job gives a ``crashed`` result; either way a fresh worker takes its place and the
other jobs go on. Workers also get replaced every ``recycle_after`` jobs, so state one task leaves in a
process (a monkeypatched torch, a leaked tensor) reaches at most that many others.

Workers start from ``autoprofiler.evaluation.workers.worker_env`` (the evaluator's scrubbed
environment: no ``PYTHONPATH``, a temp dir as home, one OpenMP thread on the CPU) with
``AUTOPROFILER_TASK_SIZE`` set per job by the worker itself.

Example:
    >>> with WorkerPool(workers=2, timeout_s=60) as pool:                          # doctest: +SKIP
    ...     results = pool.run([{"kind": "cpu_check", "source": src, ...}])
    >>> results[0].ok, results[0].kind                                               # doctest: +SKIP
    (True, '')
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from autoprofiler.evaluation.results import EvalConfig
from autoprofiler.evaluation.workers import worker_env

log = logging.getLogger(__name__)

WORKER_PATH = Path(__file__).resolve().with_name("_worker.py")
READY_TIMEOUT_S = 300.0  # importing torch (and creating a CUDA context) on a loaded machine


@dataclass(frozen=True)
class JobResult:
    """One job's outcome: ``ok``, or a reason ``kind`` (``timeout``, ``crashed``, or what the worker
    reported, e.g. ``nondeterministic``) and text; ``data`` holds the measurements of a passing job."""

    ok: bool
    kind: str = ""
    reason: str = ""
    data: dict = field(default_factory=dict)
    seconds: float = 0.0


class PoolError(Exception):
    """A worker could not be started (not a task's fault)."""


class _Worker:
    def __init__(self, args: list[str], env: dict[str, str], home: Path):
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / "worker.log"
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", str(WORKER_PATH), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                env=env,
                cwd=home,
                start_new_session=True,
            )
        self.buffer = b""
        self.spawned = time.monotonic()
        self.ready = False
        self.job: int | None = None
        self.started = 0.0
        self.limit_s = 0.0
        self.done = 0

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, index: int, job: dict, limit_s: float) -> None:
        self.job, self.started, self.limit_s = index, time.monotonic(), limit_s
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def read_lines(self) -> list[bytes] | None:
        """Complete lines now readable; None at end of file (the worker exited)."""
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line for line in lines if line.strip()]

    def log_tail(self, limit: int = 300) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return (text[-1] if text else "")[-limit:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class WorkerPool:
    """``workers`` worker processes for ``device``; use as a context manager (``close`` kills them).

    Args:
        workers: processes running jobs at once.
        timeout_s: wall-clock limit of one job, from the moment it is sent.
        device: ``"cpu"`` or ``"cuda"``/``"cuda:N"`` (passed to the worker, which sets limits for it).
        memory_limit_gb: ``RLIMIT_AS`` of a CPU worker (0: none).
        threads: torch intra-op threads per worker.
        memory_fraction: on CUDA, ``torch.cuda.set_per_process_memory_fraction`` of each worker (0: none).
        recycle_after: jobs a worker runs before it is replaced.
        env: extra environment variables for the workers.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 60.0,
        device: str = "cpu",
        memory_limit_gb: float = 4.0,
        threads: int = 1,
        memory_fraction: float = 0.0,
        recycle_after: int = 500,
        env: dict[str, str] | None = None,
    ):
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"workers must be >= 1 and timeout_s > 0, got {workers} and {timeout_s}")
        self.timeout_s = timeout_s
        self.recycle_after = recycle_after
        self.tmp = Path(tempfile.mkdtemp(prefix="autoprofiler-generate-"))
        self.env = {
            **worker_env(EvalConfig(device=device, task_size="small"), self.tmp, role="candidate"),
            **(env or {}),
        }
        self.args = [
            "--device",
            device,
            "--memory-limit-gb",
            str(memory_limit_gb),
            "--threads",
            str(threads),
            "--memory-fraction",
            str(memory_fraction),
        ]
        self.started = 0
        self.workers = [self._start() for _ in range(workers)]

    def _start(self) -> _Worker:
        self.started += 1
        return _Worker(self.args, self.env, self.tmp / f"w{self.started}")

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.workers = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run(
        self,
        jobs: Iterable[dict],
        on_result: Callable[[int, JobResult], None] | None = None,
        stop_at: float | None = None,
    ) -> dict[int, JobResult]:
        """Run ``jobs`` (dicts for ``_worker.py``); returns ``{job index: JobResult}``.

        A job's ``"timeout_s"`` key, when present, replaces the pool's ``timeout_s`` for that job.

        ``on_result(index, result)`` is called as each job finishes (in completion order). With
        ``stop_at`` (a ``time.monotonic()`` value) no job is sent after that moment; the jobs not sent
        are missing from the result.

        Raises:
            PoolError: a worker did not become ready within ``READY_TIMEOUT_S`` of its start, or exited
                before it was ready (not a task's fault: the environment is broken).
        """
        pending = list(enumerate(jobs))
        pending.reverse()
        results: dict[int, JobResult] = {}
        while pending or any(w.job is not None for w in self.workers):
            now = time.monotonic()
            for worker in self.workers:
                if worker.ready and worker.job is None and pending and (stop_at is None or now < stop_at):
                    index, job = pending.pop()
                    worker.send(index, job, float(job.get("timeout_s", self.timeout_s)))
            if stop_at is not None and now >= stop_at and all(w.job is None for w in self.workers):
                break
            busy = [w for w in self.workers if w.job is not None]
            stuck = [w for w in self.workers if not w.ready and now - w.spawned > READY_TIMEOUT_S]
            if stuck:
                raise PoolError(
                    f"a worker did not become ready in {READY_TIMEOUT_S:.0f} s: {stuck[0].log_tail()}"
                )
            deadline = min((w.started + w.limit_s for w in busy), default=now + 1.0)
            readable, _, _ = select.select(self.workers, [], [], max(0.0, min(deadline - now, 1.0)))
            for worker in readable:
                self._read(worker, results, on_result)
            now = time.monotonic()
            for worker in [w for w in self.workers if w.job is not None and now - w.started > w.limit_s]:
                late = JobResult(False, "timeout", f"no result in {worker.limit_s:g} s")
                self._replace(worker, results, on_result, late)
        return results

    def _read(self, worker: _Worker, results: dict, on_result) -> None:
        lines = worker.read_lines()
        if lines is None:
            code = worker.proc.wait()
            if not worker.ready:
                raise PoolError(f"a worker exited while starting ({_exit_reason(code)}): {worker.log_tail()}")
            reason = f"the worker process died ({_exit_reason(code)}); last log line: {worker.log_tail()}"
            self._replace(worker, results, on_result, JobResult(False, "crashed", reason))
            return
        for line in lines:
            message = json.loads(line)
            if message.get("ready"):
                worker.ready = True
                continue
            index, seconds = worker.job, time.monotonic() - worker.started
            worker.job, worker.done = None, worker.done + 1
            ok = bool(message.pop("ok"))
            kind, reason = message.pop("kind", ""), message.pop("reason", "")
            message.pop("id", None)
            self._finish(index, JobResult(ok, kind, reason, message, round(seconds, 4)), results, on_result)
        if worker.job is None and worker.done >= self.recycle_after:
            self._replace(worker, results, on_result, None)

    def _replace(self, worker: _Worker, results: dict, on_result, result: JobResult | None) -> None:
        index = worker.job
        worker.kill()
        self.workers[self.workers.index(worker)] = self._start()
        if result is not None and index is not None:
            self._finish(index, result, results, on_result)

    @staticmethod
    def _finish(index: int, result: JobResult, results: dict, on_result) -> None:
        results[index] = result
        if on_result is not None:
            on_result(index, result)
