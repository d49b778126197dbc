"""The code that runs inside a sandboxed evaluation worker (one fresh process per evaluation).

Started by ``Evaluator`` as ``python -s <this file> --result-fd N --device D --memory-limit-gb G``
(by path, not ``-m``, so no package ``__init__`` runs inside the sandbox). The protocol:

1. Warm up: set resource limits, import torch, create the CUDA context when the device is CUDA, then
   write ``{"ready": ...}`` as one JSON line to the result fd.
2. Read one job from stdin (JSON: task source, candidate source, config, nonce).
3. Run it (KernelBench-like, below), write ``{"nonce": ..., "result": {...}}`` and ``os._exit(0)``.
   Progress lines ``{"phase": ...}`` are written before each step so the parent can say where a
   worker hung or died.

Job steps. Everything the reference computes is computed *before* the candidate is imported, so a
candidate that monkeypatches torch at import cannot change the answers it is compared with:

- load the task source as its own module; ``torch.manual_seed(seed)``; ``Model(*get_init_inputs())``;
- for each correctness trial ``t``: ``torch.manual_seed(seed + t)``; ``get_inputs()`` on the device;
  the reference runs on its own clone; inputs and outputs are kept (plus a few input sets for timing);
- load the candidate as its own module; ``torch.manual_seed(seed)``; ``ModelNew(*get_init_inputs())``.
  A failure in either step is ``compile_error`` (importing the module and constructing ``ModelNew`` is
  the build step: most ``load_inline`` candidates compile in one of the two);
- each trial: the candidate runs on its own clone; the device is synchronized (side-stream work
  finishes); outputs are checked: structure/shape (``wrong_shape``), dtype, NaN/Inf where the reference
  is finite, ``allclose`` with dtype tolerances and a relative-norm check (``wrong_output``); then the
  hack checks (``suspicious``): the candidate wrote into its inputs (when the reference does not), it
  called the reference ``Model``, it replaced a public torch function; after timing: Python threads it
  started used CPU while the models were timed, or are still executing its code when timing ends (a GIL
  hog slows the reference; idle pools are fine);
- timing: ``warmup`` calls each, then ``timing_trials`` interleaved pairs (the order alternates each
  pair), input sets rotated; on CUDA each timed call is preceded by an L2 flush (writing a 256 MB
  buffer) and timed with CUDA events where the end event is recorded only after a device-wide
  synchronize (work the candidate left on a side stream is counted); on CPU ``time.perf_counter``.
  An optional ``timing_lock`` file is held (``fcntl.flock``) during this phase only;
- the output of the last timed candidate call is checked against the reference for the same inputs
  (catches candidates that return cached or stale outputs once the correctness trials are over).

Defenses run inside the candidate's own process and are best-effort against code that deliberately
attacks the harness (it can read this process's memory); the process boundary, the timeout and the
nonce on the result line are the real sandbox. Only the standard library is imported at module level
(torch is imported at warm-up), and nothing from the package: this file runs as a plain script.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import math
import os
import sys
import threading
import time
import traceback
import types

# Substrings of exception messages that mean the CUDA context is gone (sticky errors): the process is
# as good as dead, so these are classified "crashed" like a segfault.
FATAL_CUDA_PATTERNS = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
    "an illegal",
    "uncorrectable ECC",
    "launch timed out",
    "CUDA error: unknown error",
)

# Replaced by torch itself with a functools.wraps wrapper of the original: importing torch._dynamo
# (any torch.compile candidate) wraps torch.manual_seed. Not a hack when the wrapper wraps the original.
BENIGN_PATCHES = frozenset({"torch.manual_seed"})

TASK_MODULE = "_autoprofiler_reference_task"
CANDIDATE_MODULE = "_autoprofiler_candidate"
CANDIDATE_FILENAME = "<candidate>"  # the code object filename of everything the candidate defines


class Failure(Exception):
    """A classified outcome: ``kind`` is one of the evaluator's error kinds (or ``task_error``, or
    ``evaluator_error``: the evaluation machinery failed, e.g. the timing lock; the parent raises)."""

    def __init__(self, kind: str, message: str, compiled: bool = True):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.compiled = compiled


# --------------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------------
class _Channel:
    """One JSON object per line on the inherited result fd."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, obj: dict) -> None:
        data = (json.dumps(obj, default=str) + "\n").encode()
        while data:
            n = os.write(self.fd, data)
            data = data[n:]


class _Runner:
    """Runs one job. Holds the torch functions it needs, captured before any candidate code runs."""

    def __init__(self, torch, device: str, channel: _Channel):
        self.torch = torch
        self.device = torch.device(device)
        self.channel = channel
        self.is_cuda = self.device.type == "cuda"
        # Captured now, before the candidate can monkeypatch torch.
        t = torch
        self.Tensor = t.Tensor
        self.allclose = t.allclose
        self.isfinite = t.isfinite
        self.equal = t.equal
        self.vector_norm = t.linalg.vector_norm
        self.logical_and = t.logical_and
        self.logical_not = t.logical_not
        self.abs = t.abs
        self.sub = t.sub
        self.argmax = t.argmax
        self.manual_seed = t.manual_seed
        self.no_grad = t.no_grad
        self.clone = t.Tensor.clone
        self.detach = t.Tensor.detach
        self.to = t.Tensor.to
        self.perf_counter = time.perf_counter
        self.as_subclass = t.Tensor.as_subclass
        self.no_torch_function = t._C.DisableTorchFunctionSubclass
        if self.is_cuda:
            self.synchronize = t.cuda.synchronize
            self.Event = t.cuda.Event
        else:
            self.synchronize = lambda *a, **k: None
            self.Event = None
        self.candidate_active = False
        self.reference_calls = 0

    # -- helpers -----------------------------------------------------------------------------------
    def phase(self, name: str) -> None:
        self.channel.send({"phase": name})

    def sync(self) -> None:
        self.synchronize(self.device) if self.is_cuda else None

    def make_inputs(self, get_inputs):
        """``get_inputs()`` created on the device itself: at full size, drawing a GiB of random numbers
        on the CPU and copying them over took up to 50 s per evaluation on the H200 (seen 2026-12-02)."""
        if self.is_cuda:
            with self.torch.device(self.device):
                return self.move(get_inputs())
        return self.move(get_inputs())

    def move(self, obj):
        if isinstance(obj, self.Tensor):
            return self.to(obj, self.device)
        if isinstance(obj, list):
            return [self.move(o) for o in obj]
        if isinstance(obj, tuple):
            return tuple(self.move(o) for o in obj)
        return obj

    def clone_all(self, obj):
        if isinstance(obj, self.Tensor):
            return self.clone(obj)
        if isinstance(obj, list):
            return [self.clone_all(o) for o in obj]
        if isinstance(obj, tuple):
            return tuple(self.clone_all(o) for o in obj)
        return copy.deepcopy(obj)

    def detach_all(self, obj):
        return [self.clone(self.detach(t)) if isinstance(t, self.Tensor) else t for t in self.flatten(obj)]

    def flatten(self, obj) -> list:
        if isinstance(obj, (list, tuple)):
            out = []
            for o in obj:
                out.extend(self.flatten(o))
            return out
        return [obj]

    def same_inputs(self, a, b) -> bool:
        fa, fb = self.flatten(a), self.flatten(b)
        for x, y in zip(fa, fb, strict=True):
            if isinstance(x, self.Tensor):
                if not isinstance(y, self.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                    return False
                # equal() is False for NaN: NaN in the same places counts as unchanged
                if not self.equal(x, y) and not self._equal_nan(x, y):
                    return False
        return True

    def _equal_nan(self, x, y) -> bool:
        if not x.is_floating_point():
            return False
        return bool(self.allclose(x, y, rtol=0.0, atol=0.0, equal_nan=True))

    def seed(self, s: int) -> None:
        self.manual_seed(s)

    # -- comparison --------------------------------------------------------------------------------
    def tolerances(self, dtype, config: dict) -> tuple[float, float, float]:
        torch = self.torch
        low = dtype in (torch.float16, torch.bfloat16)
        default = 1e-2 if low else 1e-4
        atol = config.get("atol")
        rtol = config.get("rtol")
        atol = default if atol is None else float(atol)
        rtol = default if rtol is None else float(rtol)
        rel = config.get("rel_norm_tol")
        rel = 10.0 * max(atol, rtol) if rel is None else float(rel)
        return atol, rtol, rel

    def compare(self, ref_out: list, new_out, config: dict, what: str) -> None:
        """Raise ``Failure`` when the candidate's outputs do not match the reference's.

        Runs with ``__torch_function__`` overrides disabled and tensor subclasses viewed as plain
        tensors, so an output subclass cannot answer the comparisons itself.
        """
        with self.no_torch_function():
            self._compare(ref_out, new_out, config, what)

    def _compare(self, ref_out: list, new_out, config: dict, what: str) -> None:
        new = self.flatten(new_out)
        if len(new) != len(ref_out):
            raise Failure("wrong_shape", f"{what}: {len(new)} outputs, expected {len(ref_out)}")
        for i, (r, n) in enumerate(zip(ref_out, new, strict=True)):
            name = f"{what}: output {i}" if len(ref_out) > 1 else what
            if isinstance(r, self.Tensor):
                self.compare_tensor(r, n, config, name)
            elif isinstance(r, float) and isinstance(n, (int, float)):
                if not math.isclose(r, n, rel_tol=1e-4, abs_tol=1e-4):
                    raise Failure("wrong_output", f"{name}: {n!r}, expected {r!r}")
            elif r != n:
                raise Failure("wrong_output", f"{name}: {n!r}, expected {r!r}")

    def compare_tensor(self, r, n, config: dict, name: str) -> None:
        torch = self.torch
        if not isinstance(n, self.Tensor):
            raise Failure(
                "wrong_shape", f"{name}: got {type(n).__name__}, expected a tensor of shape {tuple(r.shape)}"
            )
        if type(n) is not self.Tensor:
            n = self.as_subclass(n, self.Tensor)
        if tuple(n.shape) != tuple(r.shape):
            raise Failure("wrong_shape", f"{name}: shape {tuple(n.shape)}, expected {tuple(r.shape)}")
        if n.dtype != r.dtype:
            raise Failure("wrong_output", f"{name}: dtype {n.dtype}, expected {r.dtype}")
        if n.device.type != r.device.type:
            raise Failure("wrong_output", f"{name}: on device {n.device}, expected {r.device}")
        n = self.detach(n)
        if not r.is_floating_point() and not r.is_complex():
            if not self.equal(n, r):
                raise Failure("wrong_output", f"{name}: integer/bool values differ from the reference")
            return
        atol, rtol, rel_tol = self.tolerances(r.dtype, config)
        rd, nd = self.to(r, torch.float64), self.to(n, torch.float64)
        r_fin, n_fin = self.isfinite(rd), self.isfinite(nd)
        bad = self.logical_and(r_fin, self.logical_not(n_fin))
        if bool(bad.any()):
            raise Failure(
                "wrong_output", f"{name}: {int(bad.sum())} NaN/Inf values where the reference is finite"
            )
        if not bool(self.allclose(nd, rd, rtol=rtol, atol=atol, equal_nan=True)):
            both = self.logical_and(r_fin, n_fin)
            diff = self.abs(self.sub(nd, rd))
            diff = torch.where(both, diff, torch.zeros_like(diff))
            k = int(self.argmax(diff.reshape(-1)))
            worst, got, want = (float(t.reshape(-1)[k]) for t in (diff, nd, rd))
            raise Failure(
                "wrong_output",
                f"{name}: not allclose (atol={atol:g}, rtol={rtol:g}): max abs diff {worst:.3g}"
                f" at flat index {k} (got {got:.6g}, expected {want:.6g})",
            )
        both = self.logical_and(r_fin, n_fin)
        ref_norm = float(self.vector_norm(rd[both]))
        if ref_norm > 0.0:
            err = float(self.vector_norm(self.sub(nd[both], rd[both]))) / ref_norm
            if err > rel_tol:
                raise Failure(
                    "wrong_output",
                    f"{name}: relative error norm |out-ref|/|ref| = {err:.3g} > {rel_tol:g} although "
                    f"allclose passed (outputs near zero, |ref| = {ref_norm:.3g}: KernelBench issue 165)",
                )

    # -- module loading ----------------------------------------------------------------------------
    def load_module(self, name: str, source: str, filename: str) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module
        code = compile(source, filename, "exec")
        exec(code, module.__dict__)
        return module

    def guard_reference(self, model_cls) -> tuple:
        """Wrap ``Model.forward`` so a call while the candidate runs is recorded; returns the original."""
        original = model_cls.__dict__.get("forward")
        if original is None:
            return model_cls, None
        runner = self

        def forward(*args, **kwargs):
            if runner.candidate_active:
                runner.reference_calls += 1
            return original(*args, **kwargs)

        model_cls.forward = forward
        return model_cls, original

    def candidate_call(self, fn, *args):
        self.candidate_active = True
        try:
            return fn(*args)
        finally:
            self.candidate_active = False

    def torch_snapshot(self) -> dict:
        """Every public callable of torch, torch.nn.functional, torch.Tensor and nn.Module, by name."""
        torch = self.torch
        snap = {}
        for label, ns in (
            ("torch", vars(torch)),
            ("torch.nn.functional", vars(torch.nn.functional)),
            ("torch.Tensor", vars(torch.Tensor)),
            ("torch.nn.Module", vars(torch.nn.Module)),
        ):
            for key, value in list(ns.items()):
                if key.startswith("_") or isinstance(value, types.ModuleType) or not callable(value):
                    continue
                snap[f"{label}.{key}"] = value
        return snap

    def changed_torch(self, before: dict) -> list[str]:
        """Names whose object changed since ``before``, except torch's own wrappers (``BENIGN_PATCHES``)."""
        after = self.torch_snapshot()
        changed = []
        for name, old in before.items():
            new = after.get(name, old)
            if new is old:
                continue
            if name in BENIGN_PATCHES and getattr(new, "__wrapped__", None) is old:
                continue
            changed.append(name)
        return sorted(changed)

    # -- the job -----------------------------------------------------------------------------------
    def run(self, job: dict) -> dict:
        torch = self.torch
        cfg = job["config"]
        seed = int(cfg.get("seed", 42))
        n_trials = max(1, int(cfg.get("correctness_trials", 5)))
        n_sets = max(1, int(cfg.get("timing_input_sets", 3)))
        details: dict = {"torch": torch.__version__}
        if self.is_cuda:
            details["device_name"] = torch.cuda.get_device_name(self.device)

        with self.no_grad():
            # ---- reference: everything computed before the candidate exists ----
            self.phase("loading the task")
            try:
                task = self.load_module(TASK_MODULE, job["task_source"], "<task>")
                Model, get_inputs, get_init_inputs = task.Model, task.get_inputs, task.get_init_inputs
                init_inputs = self.move(get_init_inputs())
                self.seed(seed)
                ref = Model(*self.clone_all(init_inputs))
                if isinstance(ref, torch.nn.Module):
                    ref = ref.to(self.device)
            except Exception as exc:
                raise Failure(
                    "task_error", "the task failed to load: " + _describe(exc), compiled=False
                ) from exc

            self.phase("running the reference")
            trials, ref_mutates = [], False
            try:
                for t in range(n_trials):
                    self.seed(seed + t)
                    inputs = self.make_inputs(get_inputs)
                    mine = self.clone_all(inputs)
                    out = ref(*mine)
                    self.sync()
                    ref_mutates |= not self.same_inputs(inputs, mine)
                    trials.append((inputs, self.detach_all(out)))
                timing_sets = []
                for k in range(n_sets):
                    self.seed(seed + 10_000 + k)
                    inputs = self.make_inputs(get_inputs)
                    out = ref(*self.clone_all(inputs))
                    self.sync()
                    timing_sets.append((inputs, self.detach_all(out)))
            except Exception as exc:
                raise Failure(
                    "task_error", "the reference failed: " + _describe(exc), compiled=False
                ) from exc
            details["ref_mutates_inputs"] = ref_mutates

            # ---- candidate: import and construct (the build step) ----
            snapshot = self.torch_snapshot()
            threads_before = {t.ident for t in threading.enumerate()}
            model_cls, original_forward = self.guard_reference(Model)
            self.phase("loading the candidate")
            try:
                cand = self.load_module(CANDIDATE_MODULE, job["candidate_source"], CANDIDATE_FILENAME)
                ModelNew = getattr(cand, "ModelNew", None)
                if ModelNew is None:
                    raise Failure("compile_error", "the candidate module defines no ModelNew", compiled=False)
                self.phase("constructing ModelNew")
                self.seed(seed)
                new = self.candidate_call(ModelNew, *self.clone_all(init_inputs))
                if isinstance(new, torch.nn.Module):
                    new = new.to(self.device)
                self.sync()
            except Failure:
                raise
            except BaseException as exc:
                raise _classify(exc, "compile_error", "building the candidate", compiled=False) from exc

            # ---- correctness ----
            for t, (inputs, ref_out) in enumerate(trials):
                self.phase(f"correctness trial {t}")
                mine = self.clone_all(inputs)
                try:
                    out = self.candidate_call(new, *mine)
                    self.sync()
                except BaseException as exc:
                    raise _classify(exc, "runtime_error", f"correctness trial {t}") from exc
                self.compare(ref_out, out, cfg, f"trial {t}")
                if not ref_mutates and not self.same_inputs(inputs, mine):
                    raise Failure(
                        "suspicious", f"trial {t}: the candidate modified its inputs (the reference does not)"
                    )
                if self.reference_calls:
                    raise Failure("suspicious", "the candidate called the reference Model")
            changed = self.changed_torch(snapshot)
            if changed:
                raise Failure(
                    "suspicious", "the candidate replaced torch functions: " + ", ".join(changed[:8])
                )
            if original_forward is not None:  # no guard overhead on the timed reference calls
                model_cls.forward = original_forward

            # ---- timing ----
            self.phase("timing")
            lock = _timing_lock(cfg.get("timing_lock"))
            try:  # the evaluator's fault, not the candidate's: reported apart, never a candidate's error
                lock.acquire()
            except OSError as exc:
                raise Failure("evaluator_error", f"timing lock: {_describe(exc)}") from exc
            try:
                with lock:
                    cpu_before = thread_cpu_s(stray_threads(threads_before))
                    t_start = self.perf_counter()
                    ref_times, new_times, last = self.time_pair(
                        ref, new, timing_sets, cfg, share_inputs=not ref_mutates
                    )
                    timing_wall = self.perf_counter() - t_start
            except Failure:
                raise
            except BaseException as exc:
                raise _classify(exc, "runtime_error", "timing") from exc
            if not ref_mutates:  # checked first: scribbled inputs also make the last output wrong
                for (pristine, _), used in zip(timing_sets, self.timed_inputs, strict=True):
                    if not self.same_inputs(pristine, used):
                        raise Failure("suspicious", "the candidate modified its inputs while timed")
            last_set, last_out = last
            self.compare(timing_sets[last_set][1], last_out, cfg, "last timed call")
            changed = self.changed_torch(snapshot)
            if changed:
                raise Failure(
                    "suspicious", "the candidate replaced torch functions: " + ", ".join(changed[:8])
                )
            # Threads the candidate started (a GIL hog slows the reference down) count; idle ones
            # (torch.compile's thread pool) do not. Two signs, either one enough: CPU time used while
            # timed (a measurement: a hog the OS never scheduled in a short timing phase shows none),
            # and the thread's own stack (deterministic: it is executing the candidate's code).
            stray = stray_threads(threads_before)
            cpu_after = thread_cpu_s(stray)
            busy = sum(cpu_after[t.ident] - cpu_before.get(t.ident, 0.0) for t in stray)
            if busy > max(0.05, 0.1 * timing_wall):
                names = ", ".join(t.name for t in stray[:4])
                raise Failure(
                    "suspicious",
                    f"the candidate's Python thread(s) ({names}) used {busy:.2f} s of CPU during the "
                    f"{timing_wall:.2f} s of timing: they compete with the reference",
                )
            running = threads_in_candidate_code(stray)
            if running:
                names = ", ".join(t.name for t in running[:4])
                raise Failure(
                    "suspicious",
                    f"the candidate's Python thread(s) ({names}) were still running the candidate's "
                    "code when timing ended: they compete with the reference",
                )

        ref_med, ref_iqr = median_iqr(ref_times)
        new_med, new_iqr = median_iqr(new_times)
        details.update(
            timing_trials=len(ref_times),
            correctness_trials=n_trials,
            timer_overhead_ms=getattr(self, "timer_overhead_ms", None),
        )
        return {
            "compiled": True,
            "correct": True,
            "error_kind": None,
            "error": "",
            "ref_ms": ref_med,
            "new_ms": new_med,
            "ref_iqr_ms": ref_iqr,
            "new_iqr_ms": new_iqr,
            "details": details,
        }

    def time_pair(self, ref, new, sets: list, cfg: dict, share_inputs: bool):
        """Interleaved timing; returns ``(ref_ms list, new_ms list, (last set, last candidate output))``.

        ``share_inputs``: both models read the very same input tensors (same addresses, so no cache or
        alignment bias between them); only when neither writes into its inputs. The caller checks the
        shared inputs afterwards (a candidate writing into them while timed is ``suspicious``).
        """
        torch = self.torch
        warmup = max(0, int(cfg.get("warmup", 10)))
        trials = max(1, int(cfg.get("timing_trials", 100)))
        ref_sets = [self.clone_all(s[0]) for s in sets]
        new_sets = ref_sets if share_inputs else [self.clone_all(s[0]) for s in sets]
        self.timed_inputs = ref_sets
        flush = None
        if self.is_cuda and int(cfg.get("l2_flush_mb", 256)) > 0:
            flush = torch.empty(
                int(cfg.get("l2_flush_mb", 256)) * 2**20 // 4, dtype=torch.int32, device=self.device
            )
        # Both models are called the same way (no wrapper: the reference guard is off by now) and each
        # keeps its previous output alive until its next call, so neither gets an allocator advantage
        # (a freed 4 MB block reused by one side and fresh pages faulted in by the other is a 5% bias).
        held = {False: None, True: None}
        for i in range(warmup):
            k = i % len(sets)
            held[False] = ref(*ref_sets[k])
            held[True] = new(*new_sets[k])
        self.sync()

        def timed(fn, args):
            if self.is_cuda:
                if flush is not None:
                    flush.zero_()
                start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
                start.record()
                out = fn(*args)
                self.synchronize(self.device)  # the whole device: side-stream work counts
                end.record()
                end.synchronize()
                return out, float(start.elapsed_time(end))
            t0 = self.perf_counter()
            out = fn(*args)
            return out, (self.perf_counter() - t0) * 1e3

        # What the timer adds to every measurement (event record + device sync + event record): the
        # same for both models, so it biases speedups toward 1.0 for the tiniest kernels; reported, not
        # subtracted.
        overhead = [timed(lambda: None, ())[1] for _ in range(10)] if self.is_cuda else [0.0]
        self.timer_overhead_ms = median_iqr(overhead)[0]
        times = {False: [], True: []}
        last_set = 0
        for i in range(trials):
            k = i % len(sets)
            for is_new in (False, True) if i % 2 == 0 else (True, False):
                model, args = (new, new_sets[k]) if is_new else (ref, ref_sets[k])
                held[is_new], ms = timed(model, args)
                times[is_new].append(ms)
            last_set = k
        ref_times, new_times, last = times[False], times[True], (last_set, held[True])
        self.sync()
        return ref_times, new_times, last


def stray_threads(before: set) -> list[threading.Thread]:
    """Live Python threads whose ident is not in ``before``."""
    return [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]


def threads_in_candidate_code(threads: list[threading.Thread], samples: int = 3) -> list[threading.Thread]:
    """Threads whose innermost Python frame is in the candidate's source, in any of ``samples`` looks.

    A thread spinning in (or sleeping inside) the candidate's own functions is caught; a pool thread
    waiting in ``threading``/``queue`` code (torch.compile's, Triton's) is not, whatever it ran before.
    """
    found = {}
    for i in range(samples):
        frames = sys._current_frames()
        for t in threads:
            frame = frames.get(t.ident)
            if frame is not None and frame.f_code.co_filename == CANDIDATE_FILENAME:
                found[t.ident] = t
        if i + 1 < samples:
            time.sleep(0.005)
    return list(found.values())


def thread_cpu_s(threads: list[threading.Thread]) -> dict[int, float]:
    """CPU seconds each thread has used so far (per-thread CPU clocks; 0.0 where unavailable)."""
    out = {}
    for t in threads:
        try:
            out[t.ident] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError, TypeError):
            out[t.ident] = 0.0
    return out


class _timing_lock:
    """``fcntl.flock`` on ``path`` while timing (no-op when ``path`` is None)."""

    def __init__(self, path: str | None):
        self.path = path
        self.fh = None

    def acquire(self) -> None:
        if self.path and self.fh is None:
            import fcntl

            self.fh = open(self.path, "a")  # noqa: SIM115 - held across the block
            fcntl.flock(self.fh, fcntl.LOCK_EX)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        if self.fh is not None:
            import fcntl

            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
        return False


def median_iqr(values: list[float]) -> tuple[float | None, float | None]:
    """Median and interquartile range (linear interpolation), ``(None, None)`` for no values.

    >>> median_iqr([1.0, 2.0, 3.0, 4.0, 5.0])
    (3.0, 2.0)
    """
    if not values:
        return None, None
    xs = sorted(values)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.5), q(0.75) - q(0.25)


def _describe(exc: BaseException, limit: int = 1200) -> str:
    """``Type: message`` plus the innermost frames of the traceback, trimmed to ``limit`` characters."""
    head = f"{type(exc).__name__}: {exc}".strip()
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = f"{head} [at {where}]" if where else head
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _classify(exc: BaseException, kind: str, where: str, compiled: bool = True) -> Failure:
    message = f"{where}: {_describe(exc)}"
    if isinstance(exc, Failure) and exc.kind not in ("evaluator_error", "task_error"):
        return exc  # (a candidate raising those two kinds itself is classified like any exception)
    if any(p in str(exc) for p in FATAL_CUDA_PATTERNS):
        return Failure("crashed", f"{where}: CUDA context lost: {_describe(exc)}", compiled=compiled)
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return Failure(kind, f"{where}: the candidate raised {type(exc).__name__}({exc})", compiled=compiled)
    return Failure(kind, message, compiled=compiled)


def _set_limits(memory_limit_gb: float) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_gb > 0:
        limit = int(memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="autoprofiler sandboxed evaluation worker")
    parser.add_argument("--result-fd", type=int, help="worker: the inherited result pipe")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-limit-gb", type=float, default=0.0, help="RLIMIT_AS; 0 for none")
    parser.add_argument("--zygote-fd", type=int, help="run as fork server on this AF_UNIX socket")
    args = parser.parse_args(argv)
    # This file's folder must not shadow anything the candidate imports.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if args.zygote_fd is not None:
        zygote_main(args.zygote_fd)
    elif args.result_fd is None:
        parser.error("--result-fd or --zygote-fd is required")
    else:
        worker_main(args)


def worker_main(args: argparse.Namespace) -> None:
    """Warm up, announce readiness, run one job from stdin, write the result, exit."""
    faulthandler.enable()  # a segfault prints the Python stack to the stderr log
    channel = _Channel(args.result_fd)
    try:
        _set_limits(args.memory_limit_gb if not args.device.startswith("cuda") else 0.0)
        import torch

        if args.device.startswith("cuda"):
            dev = torch.device(args.device)
            if dev.index is not None:
                torch.cuda.set_device(dev)
            torch.empty(1, device=dev).add_(1)
            torch.cuda.synchronize(dev)
        runner = _Runner(torch, args.device, channel)
    except BaseException as exc:  # the environment is broken: say so, the parent reports it
        channel.send({"startup_error": _describe(exc)})
        os._exit(2)
    channel.send({"ready": True, "pid": os.getpid(), "torch": torch.__version__})

    job = json.loads(sys.stdin.read())
    nonce = job.get("nonce")
    try:
        result = runner.run(job)
    except Failure as f:
        result = {"compiled": f.compiled, "correct": False, "error_kind": f.kind, "error": f.message}
    except BaseException as exc:
        kind = "crashed" if any(p in str(exc) for p in FATAL_CUDA_PATTERNS) else "runtime_error"
        result = {"compiled": True, "correct": False, "error_kind": kind, "error": _describe(exc)}
    try:
        channel.send({"nonce": nonce, "result": result})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip atexit handlers and finalizers the candidate may have registered


# --------------------------------------------------------------------------------------------------
# Fork server ("zygote"): imports torch once, then forks one fresh worker per request
# --------------------------------------------------------------------------------------------------
def zygote_main(control_fd: int) -> None:
    """Serve fork requests on a SOCK_SEQPACKET socket until the parent goes away.

    Request (one packet, with two fds attached: the job pipe's read end and the result pipe's write
    end): ``{"id", "tmp", "env", "args"}``. Replies: ``{"zygote_ready": true}`` once torch is imported,
    ``{"spawned": pid, "id"}`` per fork, ``{"exited": pid, "code"}`` when a child is reaped (``code`` as
    ``Popen.returncode``: negative for a signal). The zygote never initializes CUDA (a forked CUDA
    context is unusable); each child does that itself after the fork.
    """
    import select
    import socket

    sock = socket.socket(fileno=control_fd)
    try:
        import torch  # noqa: F401 - the expensive import every child inherits
        import torch._dynamo  # noqa: F401 - wraps torch.manual_seed & co. on import: before any snapshot
    except BaseException as exc:
        sock.send(json.dumps({"zygote_error": _describe(exc)}).encode())
        os._exit(2)
    sock.send(b'{"zygote_ready": true}')
    while True:
        while True:  # reap children, report how they ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 2)
        except OSError:
            break
        if not msg:
            break  # the parent is gone
        request = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            try:
                _forked_worker(sock, request, fds)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"spawned": pid, "id": request["id"]}).encode())
    os._exit(0)


def _forked_worker(sock, request: dict, fds: list[int]) -> None:
    """In a fresh fork of the zygote: become a sandboxed worker (own session, dir, env, stdio, fds)."""
    import random

    job_fd, result_fd = fds
    sock.close()
    os.setsid()
    tmp = request["tmp"]
    os.chdir(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    out = os.open(os.path.join(tmp, "stdout.log"), flags, 0o600)
    err = os.open(os.path.join(tmp, "stderr.log"), flags, 0o600)
    os.dup2(job_fd, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in (0, 1, 2, result_fd):
            try:
                os.close(fd)
            except OSError:
                pass
    os.environ.clear()
    os.environ.update(request["env"])
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # re-read TMPDIR
    random.seed()
    argv = ["--result-fd", str(result_fd), *request["args"]]
    sys.argv = [os.path.abspath(__file__), *argv]
    parser = argparse.ArgumentParser()
    parser.add_argument("--result-fd", type=int)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-limit-gb", type=float, default=0.0)
    worker_main(parser.parse_args(argv))


if __name__ == "__main__":
    main()
