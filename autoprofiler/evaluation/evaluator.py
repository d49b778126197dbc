"""Sandboxed evaluation of a candidate ``ModelNew`` against a task's reference ``Model``.

Each evaluation runs in a *fresh pair* of worker processes: a reference process, which runs the task,
times the reference, drives and times the candidate from outside and writes the result, and a candidate
process, which runs only the candidate, on inputs it builds from the task's input functions (with the
``Model`` class replaced by a stand-in) and seeds it is sent. The reference model and its outputs never
exist in the candidate's process; its outputs go back through sealed memfds and are compared in the
reference process (``_reference.py``, ``_candidate.py``; the design and its limits: ``docs/evaluator.md``).

Pairs are made ahead of time: ``spares`` pairs wait with torch imported and (on CUDA) the context
created. Workers are forked from a per-Evaluator fork server (a "zygote" that imported torch once and
never touches CUDA), so a new worker costs milliseconds instead of the 2-5 s of a new interpreter;
``fork_server=False`` (or ``AUTOPROFILER_EVAL_FORK_SERVER=0``) starts each worker with ``Popen``
instead, and the Evaluator falls back to that by itself if a forked worker fails to start. After a job
both workers exit and a new spare pair is made.

A worker (``_harness.py``, launched by path so no package ``__init__`` runs in the sandbox) has a
scrubbed environment, its own temp dir (also ``HOME``, ``TMPDIR`` and ``TORCH_EXTENSIONS_DIR``), its own
session (the whole process group is killed on timeout and after every job), ``RLIMIT_CORE=0`` and a
memory limit (``RLIMIT_AS`` on CPU, ``RLIMIT_DATA`` for a CUDA candidate where the driver allows it).
The candidate's has no ``PYTHONPATH``; run as root, it becomes ``nobody`` where the Python installation
is readable by other users. Limits are set by the worker itself rather than a ``preexec_fn``, which is
unsafe in a threaded parent such as a Ray actor. Jobs go in on pipes; the result comes back from the
reference process as one JSON line tagged with a random nonce; the candidate process has nothing to say
to the parent after its readiness line (any line from it: ``suspicious``). Candidate stdout/stderr go
to log files whose tail ends up in error messages.

Decisions (see also ``_harness.py``):

- a failure to import the candidate or to construct ``ModelNew(*get_init_inputs())`` is
  ``compile_error`` (``compiled=False``): that is the build step, where ``load_inline`` compiles;
- a CUDA error that destroys the context (illegal memory access, launch failure, device assert) is
  ``crashed`` like a segfault, even when torch reports it as an exception;
- a speedup above ``suspicious_speedup`` keeps its times but becomes ``correct=False,
  error_kind="suspicious"``: ``rewards.reward`` pays only correct results, so a result under review is
  never paid; a person can re-check it from the times kept in the result;
- a broken *task* (the reference fails to load or run) is not the candidate's fault: ``TaskError``.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import deque
from pathlib import Path

from autoprofiler.evaluation.results import (
    CANDIDATE_CROWDED_OUT,
    ERROR_KINDS,
    EVALUATOR_CAUSES,
    EvalConfig,
    EvalResult,
    EvaluatorError,
    TaskError,
)
from autoprofiler.evaluation.static_checks import check_source
from autoprofiler.evaluation.workers import ForkServer, Pair
from autoprofiler.rewards import speedup as compute_speedup
from autoprofiler.tasks import Task

log = logging.getLogger(__name__)

# Fields that shape a worker when it starts; a per-call config may not change them.
_SPAWN_FIELDS = ("device", "task_size", "memory_limit_gb")
# what a process killed by a failed allocation leaves at the end of its log (CUDA's and the CPU's)
_OUT_OF_MEMORY = ("CUDA out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory")


def candidate_died(raw: dict, exit_reason: str, log_tail: str, out_of_memory: bool) -> None:
    """Complete the reference process's result ``raw`` for a candidate whose process died: the error
    gets how it ended and its log's tail; a death by a failed allocation (``out_of_memory``: its log
    holds an out-of-memory error) at a share other evaluations had shrunk (``raw["crowded"]``) is the
    evaluator's error, like a caught one, so nothing is recorded and the cell is evaluated again, last
    alone. The log is the candidate's to write: the most a forged one gets is that later evaluation.
    """
    raw["error"] = f"{raw.get('error')} ({exit_reason}; {log_tail})"
    if raw.get("crowded") and out_of_memory:
        raw["error_kind"], raw["error"] = "evaluator_error", f"{raw['crowded']}: {raw['error']}"
        raw["cause"] = CANDIDATE_CROWDED_OUT


def _cause(raw: dict) -> str:
    """The raw result's ``cause`` when it is one of ``EVALUATOR_CAUSES`` (the reference process names
    it), else ``""``."""
    cause = raw.get("cause")
    return cause if cause in EVALUATOR_CAUSES else ""


def identity_candidate(task_source: str) -> str:
    """A candidate that is the reference itself (``ModelNew = Model``): for noise-floor measurements.

    >>> identity_candidate("class Model: pass").endswith("ModelNew = Model\\n")
    True
    """
    return task_source.rstrip("\n") + "\n\n\nModelNew = Model\n"


def _failure(kind: str, error: str, config: EvalConfig, wall_s: float, compiled: bool = False, **extra):
    assert kind in ERROR_KINDS, kind
    return EvalResult(
        compiled=compiled,
        correct=False,
        error_kind=kind,
        error=error,
        ref_ms=extra.pop("ref_ms", None),
        new_ms=extra.pop("new_ms", None),
        ref_iqr_ms=extra.pop("ref_iqr_ms", None),
        new_iqr_ms=extra.pop("new_iqr_ms", None),
        speedup=extra.pop("speedup", None),
        device=config.device,
        wall_s=wall_s,
        details=extra.pop("details", {}),
    )


class Evaluator:
    """Evaluates candidates in fresh sandboxed workers, keeping ``spares`` warm ones ready.

    Thread-safe: several threads (e.g. a Ray actor with ``max_concurrency``) may call ``evaluate`` at
    once; each call takes its own worker. Use as a context manager or call ``close()``.

    >>> from autoprofiler.tasks import load_task_file
    >>> task = load_task_file("datasets/suite/l1/relu.py")  # doctest: +SKIP
    >>> with Evaluator(EvalConfig(task_size="small", timing_trials=20), spares=2) as ev:  # doctest: +SKIP
    ...     ev.evaluate(task, identity_candidate(task.source)).correct
    True
    """

    def __init__(
        self,
        config: EvalConfig | None = None,
        spares: int = 1,
        startup_timeout_s: float = 180.0,
        fork_server: bool | None = None,
    ):
        self.config = config or EvalConfig()
        if spares < 0:
            raise ValueError(f"spares must be >= 0, got {spares}")
        # a lock or ledger the reference processes cannot open would fail every evaluation: say so now
        shared_files = (
            ("timing lock", self.config.timing_lock),
            ("memory ledger", self.config.memory_ledger),
        )
        for what, path in shared_files:
            if path:
                try:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
                except OSError as exc:
                    raise EvaluatorError(f"cannot create the {what} {path}: {exc}") from exc
        claims = self.config.core_claims
        if claims:  # the evaluator's user's only: a candidate (another user) cannot hold its cores' locks
            try:
                Path(claims).mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(claims, 0o700)  # one made before, by this user, with another mode
            except OSError as exc:
                raise EvaluatorError(f"cannot create the core claims folder {claims}: {exc}") from exc
        self.spares = spares
        self.startup_timeout_s = startup_timeout_s
        if fork_server is None:  # AUTOPROFILER_EVAL_FORK_SERVER=0 turns it off without code changes
            fork_server = os.environ.get("AUTOPROFILER_EVAL_FORK_SERVER", "1") != "0"
        self.fork_server = fork_server
        self._server: ForkServer | None = None
        self._pool: deque[Pair] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self.evaluations = 0
        self._replenish()

    # -- pool --------------------------------------------------------------------------------------
    def _spawn(self) -> Pair:
        """A new pair of workers (call with ``self._lock`` held): forked by the fork server when enabled.

        A dead fork server is replaced once; if a fresh one cannot take the request either, the
        Evaluator falls back to one interpreter per worker.
        """
        for _attempt in range(2):
            if not self.fork_server:
                break
            try:
                if self._server is None or self._server.dead:
                    if self._server is not None:
                        log.warning(
                            "evaluation fork server died (%s); starting a new one", self._server.log_tail()
                        )
                        self._server.close()
                        self._server = None
                    self._server = ForkServer(self.config)
                return Pair(self.config, self._server)
            except (EvaluatorError, OSError) as exc:
                log.warning("fork server failed: %s", exc)
                if self._server is not None:
                    self._server.dead = True
        if self.fork_server:
            log.warning("falling back from the fork server to one interpreter per worker")
            self.fork_server = False
        return Pair(self.config)

    def _replenish(self) -> None:
        with self._lock:
            while not self._closed and len(self._pool) < self.spares:
                self._pool.append(self._spawn())

    def _take(self) -> Pair:
        """A warm pair of workers; one retry with a fresh one; ``EvaluatorError`` when none starts.

        When a forked worker fails to start, the Evaluator falls back to plain ``Popen`` workers for
        good (a platform where fork-after-import misbehaves still evaluates, only slower).
        """
        reason = ""
        for _attempt in range(2):
            with self._lock:
                if self._closed:
                    raise EvaluatorError("the Evaluator is closed")
                pair = self._pool.popleft() if self._pool else self._spawn()
            reason = pair.wait_ready(self.startup_timeout_s)
            if reason is None:
                return pair
            log.warning("evaluation worker failed to start: %s", reason)
            pair.dispose()
            if pair.server is not None and not pair.server.dead:  # a dead server is just restarted
                log.warning("falling back from the fork server to one interpreter per worker")
                with self._lock:
                    self.fork_server = False
                    stale, self._pool = list(self._pool), deque()
                for w in stale:
                    w.dispose()
        raise EvaluatorError(f"no evaluation worker could start on {self.config.device}: {reason}")

    def warm_up(self) -> None:
        """Block until every spare is ready (e.g. before a timing-sensitive batch)."""
        with self._lock:
            pairs = list(self._pool)
        for pair in pairs:
            pair.wait_ready(self.startup_timeout_s)

    # -- evaluation --------------------------------------------------------------------------------
    def evaluate(self, task: Task, candidate_source: str, config: EvalConfig | None = None) -> EvalResult:
        """Evaluate ``candidate_source`` (defining ``ModelNew``) against ``task``.

        Args:
            task: the reference.
            candidate_source: Python source defining ``ModelNew``.
            config: per-call override (e.g. a shorter timeout); its device, task size and memory limit
                must equal the Evaluator's (they shape the warm workers).

        Returns:
            An ``EvalResult``; candidate faults are results, never exceptions.

        Raises:
            TaskError: the reference task failed to load or run in the worker.
            EvaluatorError: no worker could start, or the machinery failed inside one (e.g. the
                timing lock could not be opened): an environment problem, not the candidate's.
            ValueError: ``config`` differs from the Evaluator's in a spawn field.
        """
        cfg = config or self.config
        for name in _SPAWN_FIELDS:
            if getattr(cfg, name) != getattr(self.config, name):
                raise ValueError(
                    f"per-call config changes {name} from {getattr(self.config, name)!r} to "
                    f"{getattr(cfg, name)!r}; create an Evaluator with that config instead"
                )
        t0 = time.monotonic()
        static = check_source(candidate_source)
        if static is not None:
            kind, reason = static
            return _failure(kind, reason, cfg, time.monotonic() - t0, details={"stage": "static check"})

        pair = self._take()
        t_job = time.monotonic()
        config = cfg.to_dict()
        ref_job = {
            "nonce": secrets.token_hex(16),
            "task_source": task.source,
            "config": config,
            "candidate_pid": pair.cand.pid,
        }
        cand_job = {
            "candidate_source": candidate_source,
            # the reference's files only
            "config": dict(config, timing_lock=None, memory_ledger=None, core_claims=None),
        }
        try:
            raw, kind, reason = pair.run(ref_job, cand_job, cfg.timeout_s)
            if raw is not None and raw.get("candidate_died"):
                pair.cand.kill()
                oom = pair.cand.log_mentions(_OUT_OF_MEMORY)
                candidate_died(raw, pair.cand.exit_reason(), pair.cand.log_tail(), oom)
            pids = {"pid": pair.cand.pid, "reference_pid": pair.ref.pid}
            workers = {"candidate_worker": pair.cand.info, "reference_worker": pair.ref.info}
        finally:
            pair.dispose()
            self._replenish()
        self.evaluations += 1
        wall = time.monotonic() - t0
        if raw is None:
            phase = pair.ref.phase
            if kind in ("timeout", "crashed") and phase in (
                "starting",
                "loading the task",
                "running the reference",
            ):
                raise TaskError(f"task {task.id}: the reference {kind} during {phase}: {reason}")
            return _failure(
                kind,
                reason,
                cfg,
                wall,
                compiled=phase not in _BUILD_PHASES,
                details={"phase": phase, **pids},
            )
        return self._result(
            task, raw, cfg, wall, time.monotonic() - t_job, {**pids, **_worker_details(workers)}
        )

    def _result(self, task: Task, raw: dict, cfg: EvalConfig, wall: float, job_s: float, extra: dict):
        kind = raw.get("error_kind")
        if kind == "task_error":
            raise TaskError(f"task {task.id}: {raw.get('error')}")
        if kind == "evaluator_error":  # not the candidate's fault: no result, so nothing is recorded
            raise EvaluatorError(
                f"evaluating a candidate for {task.id}: {raw.get('error')}", cause=_cause(raw)
            )
        details = dict(raw.get("details") or {})
        details.update(job_s=round(job_s, 3), **extra)
        result = EvalResult(
            compiled=bool(raw.get("compiled")),
            correct=bool(raw.get("correct")) and kind is None,
            error_kind=kind if kind in ERROR_KINDS else (None if kind is None else "runtime_error"),
            error=str(raw.get("error") or ""),
            ref_ms=raw.get("ref_ms"),
            new_ms=raw.get("new_ms"),
            ref_iqr_ms=raw.get("ref_iqr_ms"),
            new_iqr_ms=raw.get("new_iqr_ms"),
            speedup=compute_speedup(raw.get("ref_ms"), raw.get("new_ms")),
            device=cfg.device,
            wall_s=wall,
            details=details,
        )
        if result.correct and result.speedup is not None and result.speedup > cfg.suspicious_speedup:
            result.correct = False
            result.error_kind = "suspicious"
            result.error = (
                f"speedup {result.speedup:.1f}x is above suspicious_speedup={cfg.suspicious_speedup:g}: "
                "correct on every check but flagged for review (not rewarded)"
            )
        return result

    def close(self) -> None:
        """Kill the spare workers and remove their temp dirs. Idempotent."""
        with self._lock:
            self._closed = True
            workers, self._pool = list(self._pool), deque()
            server, self._server = self._server, None
        for pair in workers:
            pair.dispose()
        if server is not None:
            server.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() is the real API
        try:
            self.close()
        except Exception:
            pass


def _worker_details(workers: dict) -> dict:
    """What each worker said about itself when ready: its user and memory limit."""
    out = {}
    for role, info in workers.items():
        out[role] = {k: info[k] for k in ("user", "limits") if k in info}
    return out


_BUILD_PHASES = (
    "starting",
    "loading the task",
    "running the reference",
    "loading the candidate",
    "constructing ModelNew",
)


def evaluate(task: Task, candidate_source: str, config: EvalConfig | None = None) -> EvalResult:
    """One-shot convenience: a private Evaluator with no spares, one evaluation, closed.

    >>> evaluate(task, identity_candidate(task.source), EvalConfig(task_size="small"))  # doctest: +SKIP
    """
    with Evaluator(config, spares=0, fork_server=False) as ev:  # one job: a fork server would not pay off
        return ev.evaluate(task, candidate_source)
