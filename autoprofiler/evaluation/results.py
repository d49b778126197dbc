"""The evaluation contract's data: ``ERROR_KINDS``, ``EvalConfig``, ``EvalResult`` and the two errors.

Plain data only (no processes): cheap to import anywhere, e.g. in replay environments and reports.

>>> EvalResult.from_dict({"compiled": True, "correct": False, "error_kind": "timeout", "error": "slow",
...     "ref_ms": None, "new_ms": None, "ref_iqr_ms": None, "new_iqr_ms": None, "speedup": None,
...     "device": "cpu", "wall_s": 3.0}).error_kind
'timeout'
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields

ERROR_KINDS = (
    "compile_error",
    "runtime_error",
    "timeout",
    "crashed",
    "wrong_shape",
    "wrong_output",
    "suspicious",
)

# Why the evaluator failed an evaluation that other evaluations on the same device crowded out
# (``EvaluatorError.cause``; the reference process names them in ``_memory.py``): the candidate's process
# out of memory at a share the others had shrunk, the reference process out of memory beside them, or no
# room for the memory plan beside them after waiting. A recording tallies them and evaluates such cells
# again, last alone on the device.
CANDIDATE_CROWDED_OUT = "candidate_crowded_out"
REFERENCE_CROWDED_OUT = "reference_crowded_out"
NO_ROOM = "no_room"
EVALUATOR_CAUSES = (CANDIDATE_CROWDED_OUT, REFERENCE_CROWDED_OUT, NO_ROOM)

OUTPUT_TRANSPORTS = ("auto", "channel", "memfd")
TASK_SIZES = ("full", "small")
_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


class TaskError(ValueError):
    """The reference task itself failed in the worker (not the candidate's fault)."""


class EvaluatorError(RuntimeError):
    """The evaluation machinery failed, not the candidate: a worker could not start (no torch, no CUDA
    device, ...), or other evaluations on the device crowded this one out. ``cause`` is one of
    ``EVALUATOR_CAUSES`` when the evaluator names it, else ``""``."""

    def __init__(self, message: str, cause: str = ""):
        super().__init__(message)
        if cause and cause not in EVALUATOR_CAUSES:
            raise ValueError(f"cause: expected one of {EVALUATOR_CAUSES}, got {cause!r}")
        self.cause = cause


@dataclass
class EvalConfig:
    """How to evaluate. Fields past ``suspicious_speedup`` are additions to the architecture contract.

    Attributes:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        task_size: exported as ``AUTOPROFILER_TASK_SIZE`` in the worker (``"full"`` or ``"small"``).
        correctness_trials: trials with fresh inputs seeded ``seed + trial``.
        timing_trials: timed calls of each model (in alternating blocks of the two processes).
        warmup: untimed calls of each model before timing.
        atol, rtol: ``None`` picks by output dtype: 1e-4 for fp32/fp64, 1e-2 for fp16/bf16.
        seed: seeds ``Model`` and ``ModelNew`` construction and the correctness inputs (timing inputs
            use secret seeds).
        timeout_s: wall-clock limit of one job in the worker (warm-up not counted).
        memory_limit_gb: ``RLIMIT_AS`` of both CPU workers; on CUDA (which reserves huge virtual
            ranges, so ``RLIMIT_AS`` breaks it) ``RLIMIT_DATA`` of the candidate's worker, this much
            beyond what the warmed worker holds, kept only if the CUDA context still works under it
            (``details["candidate_worker"]["limits"]`` says which); GPU memory is not limited.
            ``None`` for no limit.
        suspicious_speedup: a correct candidate faster than this is flagged ``suspicious``.
        rel_norm_tol: limit on ``|out-ref|/|ref|`` (catches near-zero outputs passing ``atol``);
            ``None``: ``10 * max(atol, rtol)``.
        timing_input_sets: input sets the timed calls draw from, each made on first use from a secret
            seed (the first use of each is timed alone: memoization shows).
        l2_flush_mb: size of the buffer written before each timed CUDA call (0: no flush).
        memory_budget_gb: at most this much memory (GiB) for what the two processes of one evaluation
            hold (tasks' inputs, outputs, the model); ``None``: what the device has free (CUDA
            ``mem_get_info``; CPU: MemAvailable and each worker's ``RLIMIT_AS``). Larger tasks are held
            a trial and an input set at a time (``details["memory_plan"]``, ``docs/evaluator.md``);
            one that does not fit even so is a ``runtime_error`` saying it is too large.
        memory_ledger: path of a file in which the reference processes of every evaluation on this
            host and device write down what their memory plans hold (``_ledger.py``): a plan counts the
            others' (they may not have allocated yet), and a task that fits the device alone but not
            beside them waits for room (up to a quarter of ``timeout_s``; then the evaluator's error,
            not the candidate's). ``CellWorker`` sets one per device; ``None``: plans see only what is
            free when they are made.
        timing_lock: path of a lock file the reference process holds (``flock``) only while timing
            both models, so workers sharing a GPU build and check concurrently but time one at a time;
            the candidate's process never sees it. ``None``: no lock.
        output_transport: how the candidate's outputs reach the reference process: ``"memfd"`` (a new
            memfd per message, sealed against every change), ``"channel"`` (one memfd both processes
            map once, page-locked on CUDA so the copies run at DMA speed; its size is sealed, its bytes
            are copied out on arrival) or ``"auto"`` (channel on CUDA, memfd on CPU). ``_transport.py``.
        timing_cores: how many CPU cores both processes share while timing (each process pinned to the
            same ones, the reference process's current core first): ``0`` picks one on CUDA (a
            launch-bound model's time is its process's launch speed, which depends on the core) and as
            many as the reference process's intra-op threads on CPU.
        core_claims: a directory in which the reference processes of this host claim the cores they
            time on (``flock`` on a file per core), so evaluations timing at once on different GPUs
            share no core; when every core is claimed, one is shared and ``details["timing_cpus_shared"]``
            says so. ``CellWorker`` sets one per host; ``None``: each picks its current core, whichever
            other evaluation times there.
        trace: keep every timed call's milliseconds, block by block, in ``details["trace"]`` (for
            studying the timing's noise: ``bench/eval_throughput.py --trace``).

    >>> EvalConfig(device="cpu", task_size="small", timing_trials=20).timing_trials
    20
    """

    device: str = "cpu"
    task_size: str = "full"
    correctness_trials: int = 5
    timing_trials: int = 100
    warmup: int = 10
    atol: float | None = None
    rtol: float | None = None
    seed: int = 42
    timeout_s: float = 300.0
    memory_limit_gb: float | None = 32.0
    suspicious_speedup: float = 10.0
    rel_norm_tol: float | None = None
    timing_input_sets: int = 3
    l2_flush_mb: int = 256
    timing_lock: str | None = None
    memory_ledger: str | None = None
    memory_budget_gb: float | None = None
    output_transport: str = "auto"
    timing_cores: int = 0
    core_claims: str | None = None
    trace: bool = False

    def __post_init__(self) -> None:
        # workers run in their own temp dir: absolute paths
        for name in ("timing_lock", "memory_ledger", "core_claims"):
            if getattr(self, name):
                object.__setattr__(self, name, os.path.abspath(getattr(self, name)))
        problems = []
        if not _DEVICE_RE.match(str(self.device)):
            problems.append(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.task_size not in TASK_SIZES:
            problems.append(f"task_size must be one of {TASK_SIZES}, got {self.task_size!r}")
        for name in ("correctness_trials", "timing_trials", "timing_input_sets"):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("warmup", "l2_flush_mb", "timing_cores"):
            if int(getattr(self, name)) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
            problems.append(f"memory_budget_gb must be > 0 or None, got {self.memory_budget_gb!r}")
        if self.output_transport not in OUTPUT_TRANSPORTS:
            problems.append(
                f"output_transport must be one of {OUTPUT_TRANSPORTS}, got {self.output_transport!r}"
            )
        if not self.suspicious_speedup > 0:
            problems.append(f"suspicious_speedup must be > 0, got {self.suspicious_speedup!r}")
        if problems:
            raise ValueError("invalid EvalConfig: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EvalConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown EvalConfig keys {unknown}; expected some of {sorted(known)}")
        return cls(**d)


@dataclass
class EvalResult:
    """The outcome of one evaluation. ``details`` (an addition to the contract) holds extras.

    >>> r = EvalResult(compiled=True, correct=True, error_kind=None, error="", ref_ms=2.0, new_ms=1.0,
    ...                ref_iqr_ms=0.1, new_iqr_ms=0.1, speedup=2.0, device="cpu", wall_s=1.5)
    >>> EvalResult.from_dict(r.to_dict()) == r
    True
    """

    compiled: bool
    correct: bool
    error_kind: str | None
    error: str
    ref_ms: float | None
    new_ms: float | None
    ref_iqr_ms: float | None
    new_iqr_ms: float | None
    speedup: float | None
    device: str
    wall_s: float
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EvalResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def summary(self) -> str:
        """One readable line, e.g. ``correct  ref 1.234 ms  new 0.617 ms  speedup 2.00x``."""
        if self.correct:
            head = "correct"
        else:
            head = f"{self.error_kind}: {self.error}"
        if self.ref_ms is not None and self.new_ms is not None:
            head += (
                f"  ref {self.ref_ms:.4g} ms (iqr {self.ref_iqr_ms:.2g})"
                f"  new {self.new_ms:.4g} ms (iqr {self.new_iqr_ms:.2g})"
            )
            if self.speedup is not None:
                head += f"  speedup {self.speedup:.3f}x"
        return head + f"  [{self.device}, {self.wall_s:.1f} s]"
