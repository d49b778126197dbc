"""The program that runs inside each sandboxed evaluation worker, in one of two roles.

One evaluation uses two fresh processes, forked together as a pair and joined by a ``SOCK_SEQPACKET``
socket (the *link*):

- the **reference** process (``_reference.py``) loads the task, computes the reference outputs, times
  the reference, drives the candidate process step by step, compares its outputs and times it from
  outside; it writes the evaluation's result. It never runs candidate code.
- the **candidate** process (``_candidate.py``) imports the candidate and runs ``ModelNew`` on inputs it
  builds itself from the task's ``get_inputs`` (the task source with its ``Model`` class replaced by a
  stand-in) and the seeds the reference process sends; its outputs go back through memfds
  (``_transport.py``). The
  reference model and its outputs never exist in this process.

Started by ``Evaluator`` as ``python -s <this file> --role R --result-fd N --link-fd L --device D
--memory-limit-gb G`` (by path, not ``-m``, so no package ``__init__`` runs inside the sandbox), or
forked by the fork server (``--zygote-fd``). Each worker:

1. warms up: resource limits, (candidate, as root) drops to an unprivileged user, imports torch,
   creates the CUDA context on CUDA, writes ``{"ready": ...}`` as one JSON line on its result fd;
2. reads one job (JSON) from stdin and runs its role; the reference process writes
   ``{"nonce": ..., "result": {...}}`` on its result fd (only it knows the nonce) and exits.
   ``{"phase": ...}`` lines before each step let the parent say where a worker hung or died.

This file holds what both roles share (the link, the timer, checksums), the entry
point and the fork server. Only the standard library is imported at module level, and nothing from the
package: it runs as a plain script, and loads the two role modules beside it by path.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import gc
import importlib.util
import json
import math
import os
import random
import socket
import stat
import sys
import time
import traceback
import types
import weakref

# The role modules import this one by this name, whether it runs as a script or as a package module.
sys.modules.setdefault("_autoprofiler_harness", sys.modules[__name__])

HERE = os.path.dirname(os.path.abspath(__file__))
ROLES = ("reference", "candidate")

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

CANDIDATE_FILENAME = "<candidate>"  # the code object filename of everything the candidate defines
# The user a candidate process runs as when the evaluator runs as root ("nobody" on Debian/Ubuntu): it
# can then neither signal, trace nor read the memory of the reference process (which runs as root).
UNPRIVILEGED_ID = 65534


class Failure(Exception):
    """A classified outcome: ``kind`` is one of the evaluator's error kinds (or ``task_error``, or
    ``evaluator_error``: the evaluation machinery failed, e.g. the timing lock; the parent raises)."""

    def __init__(
        self,
        kind: str,
        message: str,
        compiled: bool = True,
        out_of_memory: bool = False,
        cause: str = "",
        candidate_died: bool = False,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.compiled = compiled
        self.out_of_memory = out_of_memory  # an allocation failed (the candidate's process says so)
        self.cause = cause  # an evaluator_error's cause (``_memory``: CANDIDATE_CROWDED_OUT, ...)
        self.candidate_died = candidate_died  # the reference's link to the candidate's process broke


class ProtocolError(Exception):
    """The peer on the link sent something the protocol does not allow (or went away: ``EOFError``)."""


class Channel:
    """One JSON object per line on an inherited pipe fd (worker -> parent)."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, obj: dict) -> None:
        data = (json.dumps(obj, default=str) + "\n").encode()
        while data:
            n = os.write(self.fd, data)
            data = data[n:]

    def phase(self, name: str) -> None:
        self.send({"phase": name})


class Link:
    """JSON messages between the two processes of a pair, one ``SOCK_SEQPACKET`` packet each.

    A message may carry file descriptors (``SCM_RIGHTS``): tensors travel as memfds
    (``_transport.py``), never through ``pickle``. ``recv`` raises ``EOFError`` when the peer is gone and
    ``ProtocolError`` for a packet that is too large or not a JSON object.
    """

    MAX_MESSAGE = 1 << 20
    MAX_FDS = 2

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.MAX_MESSAGE)
        except OSError:
            pass

    def send(self, obj: dict, fds: tuple[int, ...] = ()) -> None:
        data = json.dumps(obj).encode()
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv(self) -> tuple[dict, list[int]]:
        msg, fds, flags, _addr = socket.recv_fds(self.sock, self.MAX_MESSAGE, self.MAX_FDS)
        if not msg and not fds:
            raise EOFError("the peer process closed the link")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            close_fds(fds)
            raise ProtocolError("a message larger than the protocol allows")
        try:
            obj = json.loads(msg)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            close_fds(fds)
            raise ProtocolError(f"a message that is not a JSON object: {msg[:80]!r}")
        return obj, fds


def close_fds(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Tools:
    """The torch functions both roles need, captured before any candidate code runs, and helpers.

    In the candidate process these are best-effort (the candidate can reach this object); what decides
    the result is computed in the reference process.
    """

    def __init__(self, torch, device: str):
        self.torch = torch
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        t = torch
        self.Tensor = t.Tensor
        self.clone = t.Tensor.clone
        self.empty_like, self.preserve_format = t.empty_like, t.preserve_format
        self.detach = t.Tensor.detach
        self.to = t.Tensor.to
        self.equal = t.equal
        self.allclose = t.allclose
        self.as_subclass = t.Tensor.as_subclass
        self.no_torch_function = t._C.DisableTorchFunctionSubclass
        self.no_grad = t.no_grad
        self.manual_seed = t.manual_seed
        self.int32, self.int64, self.uint8 = t.int32, t.int64, t.uint8
        self.int_of_width = {1: t.uint8, 2: t.int16, 4: t.int32, 8: t.int64}
        self.perf_counter = time.perf_counter
        if self.is_cuda:
            self.synchronize = t.cuda.synchronize
            self.Event = t.cuda.Event
        else:
            self.synchronize = None
            self.Event = None
        self.flush_buffer = None
        self.pool: dict[tuple, list] = {}  # (dtype, shape, strides) -> free CPU buffers for retained outputs

    def sync(self) -> None:
        if self.is_cuda:
            self.synchronize(self.device)

    def seed(self, s: int) -> None:
        """Seed torch (CPU and CUDA), ``random`` and numpy (when loaded): inputs must be reproducible in
        two processes."""
        self.manual_seed(s)
        random.seed(s)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(s % 2**32)

    def make_inputs(self, get_inputs, seed: int) -> list:
        """``get_inputs()`` under ``seed``, created on the device itself (drawing a GiB of random numbers
        on the CPU and copying them over took up to 50 s per evaluation on the H200)."""
        self.seed(seed)
        if self.is_cuda:
            with self.torch.device(self.device):
                return list(self.move(get_inputs()))
        return list(self.move(get_inputs()))

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

    def flatten(self, obj) -> list:
        if isinstance(obj, (list, tuple)):
            out = []
            for o in obj:
                out.extend(self.flatten(o))
            return out
        return [obj]

    def plain(self, t):
        """``t`` as a plain detached tensor (a subclass cannot answer for itself)."""
        with self.no_torch_function():
            if type(t) is not self.Tensor:
                t = self.as_subclass(t, self.Tensor)
            return self.detach(t)

    def same_inputs(self, a, b) -> bool:
        """The same tensors, value for value (NaN in the same places counts as the same)."""
        fa, fb = self.flatten(a), self.flatten(b)
        if len(fa) != len(fb):
            return False
        with self.no_torch_function():
            for x, y in zip(fa, fb, strict=True):
                if isinstance(x, self.Tensor):
                    if not isinstance(y, self.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                        return False
                    if not self.equal(x, y) and not (
                        x.is_floating_point()
                        and bool(self.allclose(x, y, rtol=0.0, atol=0.0, equal_nan=True))
                    ):
                        return False
        return True

    def checksum(self, obj) -> list:
        """Integer checksums of ``obj``'s tensors and reprs of the rest.

        A tensor's checksum is the sum of its elements read as integers of their own width, with
        wrap-around in that width (``_element_sum``): order-free, so equal values give equal sums on
        any device and in any memory layout, read in place. The layout must not matter: the harness's
        work between timed calls has to cost both processes the same (the witness subtracts the
        reference's from the candidate's), and a channels-last output copied to contiguous here would
        cost only the candidate. The sum needs every element of the output (no shortcut through the
        math of the model), so a commitment to it proves the output existed. It is no defence against
        a chosen collision at any width (a sum is linear); what it catches is an output that changes
        between the timed call and the check."""
        out = []
        with self.no_torch_function():
            for item in self.flatten(obj):
                if isinstance(item, self.Tensor):
                    out.append(f"{item.dtype}:{tuple(item.shape)}:{self._element_sum(self.plain(item))}")
                else:
                    out.append(repr(item)[:200])
        return out

    def _element_sum(self, t) -> int:
        """The sum of ``t``'s elements as integers of their width (a view, any strides; summing in a
        wider type has no vectorized CPU kernel and is 10-20x slower), or, for a width with no integer
        type (complex128), of its bytes in logical order as int64 words."""
        t = t.resolve_conj().resolve_neg()  # a lazy conjugate or negation has no integer view
        width = t.element_size()
        if width in self.int_of_width:
            kind = self.int_of_width[width]
            return int(t.view(kind).sum(dtype=kind))
        flat = t.contiguous().reshape(-1).view(self.uint8)
        whole = flat.numel() // 8 * 8
        total = int(flat[:whole].view(self.int64).sum()) if whole else 0
        return total + (int(flat[whole:].sum(dtype=self.int64)) if whole < flat.numel() else 0)

    # -- timing ------------------------------------------------------------------------------------
    def prepare_timing(self, l2_flush_mb: int) -> None:
        if self.is_cuda and l2_flush_mb > 0 and self.flush_buffer is None:
            torch = self.torch
            self.flush_buffer = torch.empty(l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)

    def timed(self, fn, args):
        """One call of ``fn(*args)``: ``(output, milliseconds)``.

        CUDA: L2 flush first, CUDA events, the end event recorded only after a device-wide synchronize
        (work left on a side stream counts). CPU: ``perf_counter``.
        """
        if self.is_cuda:
            if self.flush_buffer is not None:
                self.flush_buffer.zero_()
            start, end = self.Event(enable_timing=True), self.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            self.synchronize(self.device)
            end.record()
            end.synchronize()
            return out, float(start.elapsed_time(end))
        t0 = self.perf_counter()
        out = fn(*args)
        return out, (self.perf_counter() - t0) * 1e3

    def timed_call(self, fn, args):
        """``timed`` plus the output's checksum: ``(output, ms, checksum, untimed seconds)``.

        Both roles time through this one function, so the work around the timed region (flush, events,
        checksum) is the same in both and the reference process can subtract its own from what it
        measures around the candidate's calls.
        """
        t0 = self.perf_counter()
        out, ms = self.timed(fn, args)
        sums = self.checksum(out)
        return out, ms, sums, max(0.0, self.perf_counter() - t0 - ms / 1e3)

    def time_block(self, model, calls: list, sets: dict, make) -> tuple[list, list, list, float]:
        """Timed calls of ``model``, one per ``(set key, seed)`` in ``calls``; a set not in ``sets`` yet is
        made first (``make(key, seed)``). Returns outputs, milliseconds, checksums and the seconds spent
        outside the timed regions.

        Both processes time through this one loop, so what runs between two calls (which a short call's
        time depends on) is the same for the reference and the candidate.
        """
        outs, ms, sums = [], [], []
        collecting = gc.isenabled()
        gc.disable()  # a collection inside a timed call would charge it to whichever model it hit
        try:
            untimed = self._time_calls(model, calls, sets, make, outs, ms, sums)
        finally:
            if collecting:
                gc.enable()
        return outs, ms, sums, untimed

    def _time_calls(self, model, calls, sets, make, outs: list, ms: list, sums: list) -> float:
        """``time_block``'s loop: appends to ``outs``, ``ms``, ``sums``; returns the untimed seconds."""
        untimed = 0.0
        for key, seed in calls:
            t0 = self.perf_counter()
            if key not in sets:
                sets[key] = make(key, seed)
            untimed += self.perf_counter() - t0
            out, call_ms, checksum, rest = self.timed_call(model, sets[key])
            t0 = self.perf_counter()
            outs.append(self.retained(out))
            del out
            untimed += self.perf_counter() - t0
            ms.append(call_ms)
            sums.append(checksum)
            untimed += rest
        return untimed

    def rehearse(self, model, inputs: list, calls: int, block: int, held: int = 0) -> None:
        """Warm-up: ``calls`` calls of ``model`` on ``inputs`` through the timing loop itself (timed,
        checksums, retained copies), ``block`` at a time, each block's outputs dropped before the next
        as in timing, so caches, the allocator and the pool of retained-output buffers are in the state
        timing will find, in both processes alike, and no more outputs are alive at once than timing
        holds (the memory plan counts one block). Warming up with bare calls left the candidate
        process's first timed block up to 2x slower than the rest (small bf16 matmuls on the 2-CPU
        machine), which pulled identity speedups below 1. ``held``: the most retained copies timing
        keeps alive at once (the calls checked after the fact plus a block; ``settle_heap``)."""
        sets = dict(enumerate(inputs))
        block = max(1, block)
        for start in range(0, calls, block):
            keys = [(i % len(inputs), None) for i in range(start, min(calls, start + block))]
            outs = self.time_block(model, keys, sets, None)[0]
            self.sync()
            if start + block >= calls and not self.is_cuda:
                self.settle_heap(outs, held)
            del outs

    #: outputs' worth of the heap's top that ``settle_heap`` touches and frees, and at most these bytes
    #: (2 and 8 were tried, on l1/relu alone: 2 left timed calls faulting, 8 none)
    HEAP_TOP_OUTPUTS, HEAP_TOP_BYTES = 8, 256 * 2**20

    def settle_heap(self, outs: list, held: int) -> None:
        """CPU: put the heap in the state a long timing loop reaches, before the first timed call.

        A retained copy kept for the after-the-fact check needs a pool buffer, and a buffer allocated
        while timing can take the memory the next call's output would have reused; small allocations
        also push a freed output up the heap for the first calls after the warm-up. Either way that
        call's output faults in fresh pages (l1/relu at small size: 1.4 ms a call instead of 0.1), and
        with few timing trials the median can land on such calls in one process and not the other (an
        identity "speedup" above 10x, flagged ``suspicious``). So the pool is filled now to the
        ``held`` buffers timing keeps alive at once, and the heap's top is touched for
        ``HEAP_TOP_OUTPUTS`` outputs and freed (the worker's ``MALLOC_TRIM_THRESHOLD_`` keeps it
        resident: ``workers.worker_env``). Tensors at or above the worker's ``MALLOC_MMAP_THRESHOLD_``
        are mapped per allocation, not taken from the heap, and get no touched top.
        """
        extra = [self.retained(outs[i % len(outs)]) for i in range(max(0, held - len(outs)))] if outs else []
        heap_limit = int(os.environ.get("MALLOC_MMAP_THRESHOLD_", "0"))
        sizes = [
            t.nbytes
            for out in outs[:1]
            for t in self.flatten(out)
            if isinstance(t, self.Tensor) and 0 < t.nbytes < heap_limit
        ]
        top, total = [], 0
        with self.no_torch_function():
            for n in sizes * self.HEAP_TOP_OUTPUTS:
                if total + n > self.HEAP_TOP_BYTES:
                    break
                top.append(self.torch.ones(n, dtype=self.torch.uint8))
                total += n
        del extra, top

    def retained(self, out):
        """What a block keeps of a timed call's output until the after-the-fact choice.

        CPU: a plain copy into a buffer from a pool of this process's own, and the call's own output is
        freed before the next call, so the allocator hands that same warm memory to the next call, as
        in a loop that drops its outputs. Keeping the outputs themselves made every call of a block
        fault in fresh pages (relu at small size on the 2-CPU machine: 0.58 ms a call instead of 0.29),
        and a fresh copy per call made the next output land now on warm, now on fresh pages. A buffer
        goes back to the pool when the copy is dropped. CUDA's caching allocator has no such cost: the
        output itself is kept there.
        """
        if self.is_cuda:
            return out
        with self.no_torch_function():
            return self._pooled_copy(out)

    def _pooled_copy(self, obj):
        if isinstance(obj, self.Tensor):
            t = self.plain(obj)
            if t.numel() == 0 or t.device.type != "cpu":
                return self.clone(t)
            # the output's own layout: a channels-last output copies as one stream, like a contiguous one
            free = self.pool.setdefault((t.dtype, tuple(t.shape), t.stride()), [])
            base = free.pop() if free else self.empty_like(t, memory_format=self.preserve_format)
            base.copy_(t)
            copy = base.view(t.shape)  # its own tensor object: when it goes, the buffer is free again
            weakref.finalize(copy, free.append, base)
            return copy
        if isinstance(obj, list):
            return [self._pooled_copy(o) for o in obj]
        if isinstance(obj, tuple):
            return tuple(self._pooled_copy(o) for o in obj)
        return obj


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------
def load_module(name: str, source: str, filename: str, namespace: dict | None = None) -> types.ModuleType:
    """Execute ``source`` as a fresh module registered as ``sys.modules[name]``."""
    module = types.ModuleType(name)
    module.__file__ = filename
    module.__dict__.update(namespace or {})
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


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


def describe(exc: BaseException, limit: int = 1200) -> str:
    """``Type: message`` plus the innermost frames of the traceback, trimmed to ``limit`` characters."""
    head = f"{type(exc).__name__}: {exc}".strip()
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = f"{head} [at {where}]" if where else head
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify(exc: BaseException, kind: str, where: str, compiled: bool = True) -> Failure:
    """A candidate's exception as a ``Failure``: a lost CUDA context is ``crashed``, else ``kind``."""
    if isinstance(exc, Failure) and exc.kind not in ("evaluator_error", "task_error"):
        return exc  # (a candidate raising those two kinds itself is classified like any exception)
    if any(p in str(exc) for p in FATAL_CUDA_PATTERNS):
        return Failure("crashed", f"{where}: CUDA context lost: {describe(exc)}", compiled=compiled)
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return Failure(kind, f"{where}: the candidate raised {type(exc).__name__}({exc})", compiled=compiled)
    return Failure(kind, f"{where}: {describe(exc)}", compiled=compiled)


def set_limits(memory_limit_gb: float, device: str) -> str:
    """``RLIMIT_CORE=0`` and a memory limit; returns which memory limit is in force.

    CPU: ``RLIMIT_AS``. CUDA reserves address space far beyond what it uses, so ``RLIMIT_AS`` would
    break it; ``RLIMIT_DATA`` (private writable memory) is set after the context exists, as headroom
    beyond what the process holds then (``cuda_data_limit``), and kept only when a CUDA allocation and a
    cuBLAS call still work under it.
    """
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_gb <= 0:
        return "none"
    limit = int(memory_limit_gb * 2**30)
    if not device.startswith("cuda"):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        return f"RLIMIT_AS {memory_limit_gb:g} GiB"
    return "pending"


def cuda_data_limit(torch, device, memory_limit_gb: float) -> str:
    """Try ``RLIMIT_DATA`` on a CUDA worker (see ``set_limits``): the soft limit first, a self-test, then
    the hard limit; on any failure the limit is lifted again and the reason returned.

    The limit is ``memory_limit_gb`` beyond the private writable memory the warmed worker already holds
    (``VmData``: the CUDA context's and the libraries' host mappings count against the limit too), so
    the candidate gets that headroom whatever its libraries took. An absolute limit near what they take
    leaves no room for a thread's stack, and libgomp exits the process rather than raise."""
    import resource

    if memory_limit_gb <= 0:
        return "none"
    try:
        held = role_module("memory").proc_status_bytes("VmData")  # what RLIMIT_DATA counts
    except OSError:
        held = 0
    limit = held + int(memory_limit_gb * 2**30)
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and limit > hard:
        return f"none (RLIMIT_DATA's hard limit {hard / 2**30:.1f} GiB is below {limit / 2**30:.1f} GiB)"
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
        a = torch.randn(256, 256, device=device)
        (a @ a).sum().item()
        torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1)  # 64 MiB of host memory still allocates
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        return f"RLIMIT_DATA {memory_limit_gb:g} GiB beyond the {held / 2**30:.2f} GiB held at start-up"
    except Exception as exc:
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
        except (OSError, ValueError):
            pass
        return f"none (RLIMIT_DATA broke CUDA: {describe(exc, 200)})"


def drop_privileges(device: str) -> str:
    """As root, become ``UNPRIVILEGED_ID`` (and give up supplementary groups); returns what was done.

    Kept as root where a CUDA device node is not usable by others (the driver would refuse the user).
    """
    if os.geteuid() != 0:
        return f"uid {os.geteuid()} (not root: nothing to drop)"
    for path in _interpreter_paths():
        blocked = _closed_to_others(path)
        if blocked:
            return f"uid 0 (kept: {blocked} is not readable by other users, so Python would not be)"
    if device.startswith("cuda"):
        nodes = [os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith("nvidia")]
        modes = {n: os.stat(n).st_mode for n in nodes if os.path.exists(n)}
        closed = [n for n, mode in modes.items() if stat.S_ISCHR(mode) and mode & 0o006 != 0o006]
        if closed:
            return f"uid 0 (kept: {closed[0]} is not accessible to other users)"
    os.setgroups([])
    os.setgid(UNPRIVILEGED_ID)
    os.setuid(UNPRIVILEGED_ID)
    return f"uid {UNPRIVILEGED_ID}"


def _interpreter_paths() -> list[str]:
    """What an unprivileged candidate must read: the interpreter, its standard library, site-packages."""
    import sysconfig

    paths = [os.path.realpath(sys.executable), os.path.dirname(os.__file__)]
    paths += [sysconfig.get_paths()[key] for key in ("purelib", "platlib", "include")]
    return [p for p in paths if p and os.path.exists(p)]


def _closed_to_others(path: str) -> str | None:
    """The first folder on ``path`` (or ``path`` itself) that other users cannot enter or read."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        here = os.sep.join(parts[:i]) or os.sep
        mode = os.stat(here).st_mode
        need = 0o005 if stat.S_ISDIR(mode) else 0o004
        if mode & need != need:
            return here
    return None


def role_module(role: str) -> types.ModuleType:
    """The module ``_<role>.py`` beside this file (``reference``, ``candidate``, ``watch``), loaded by
    path once."""
    name = f"_autoprofiler_eval_{role}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"_{role}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="autoprofiler sandboxed evaluation worker")
    parser.add_argument("--role", choices=ROLES, default="reference")
    parser.add_argument("--result-fd", type=int, help="worker: the inherited result pipe")
    parser.add_argument("--link-fd", type=int, help="worker: the socket to the other process of the pair")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-limit-gb", type=float, default=0.0, help="0 for none")
    parser.add_argument("--drop-privileges", action="store_true", help="candidate as root: become nobody")
    parser.add_argument("--warm-libraries", action="store_true", help="CUDA: load cuBLAS and cuDNN first")
    parser.add_argument("--zygote-fd", type=int, help="run as fork server on this AF_UNIX socket")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    # This file's folder must not shadow anything the candidate imports.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    if args.zygote_fd is not None:
        zygote_main(args.zygote_fd)
    elif args.result_fd is None or args.link_fd is None:
        parser.error("--result-fd and --link-fd (or --zygote-fd) are required")
    else:
        worker_main(args)


def worker_main(args: argparse.Namespace) -> None:
    """Warm up, announce readiness, run one job from stdin in the worker's role, exit."""
    faulthandler.enable()  # a segfault prints the Python stack to the stderr log
    channel = Channel(args.result_fd)
    cuda = args.device.startswith("cuda")
    try:
        limits = set_limits(args.memory_limit_gb, args.device)
        user = drop_privileges(args.device) if args.drop_privileges else f"uid {os.geteuid()}"
        if args.role == "reference":
            _forbid_inspection()
        import torch

        if cuda:
            dev = torch.device(args.device)
            if dev.index is not None:
                torch.cuda.set_device(dev)
            torch.empty(1, device=dev).add_(1)
            if args.warm_libraries:
                warm_libraries(torch, dev)
            torch.cuda.synchronize(dev)
            if args.role == "candidate":
                limits = cuda_data_limit(torch, dev, args.memory_limit_gb)
            elif limits == "pending":
                limits = "none (the reference process runs trusted code only)"
        tools = Tools(torch, args.device)
        module = role_module(args.role)
        link = Link(args.link_fd)
    except BaseException as exc:  # the environment is broken: say so, the parent reports it
        channel.send({"startup_error": describe(exc)})
        os._exit(2)
    channel.send(
        {"ready": True, "pid": os.getpid(), "torch": torch.__version__, "user": user, "limits": limits}
    )

    job = json.loads(sys.stdin.read())
    job["worker"] = {"user": user, "limits": limits}
    code = 0
    try:
        module.serve(job, tools, channel, link)
    except BaseException:  # a harness bug: its traceback goes to the stderr log the parent reports
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip atexit handlers and finalizers the candidate may have registered


def warm_libraries(torch, dev) -> None:
    """Load cuBLAS(Lt) and cuDNN and create their handles and workspaces with one tiny matrix product
    and one convolution per floating dtype, and load the kernels every evaluation runs itself (the
    comparison's casts, reductions and norms, the checksums' integer sums). A process's first call of
    each costs 0.1-0.3 s for a library, milliseconds for a kernel module; a spare worker pays it while
    it waits, not the evaluation that takes it (before any job, so before any candidate code). The few
    MiB they cache are returned to the device."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.ones(64, 64, device=dev, dtype=dtype)
        x = torch.ones(1, 8, 16, 16, device=dev, dtype=dtype)
        w = torch.ones(8, 8, 3, 3, device=dev, dtype=dtype)
        b = a @ a
        torch.nn.functional.conv2d(x, w, padding=1)
        for wide in (torch.float32, torch.float64):
            bw, aw = b.to(wide), a.to(wide)
            diff = (bw - aw).abs_()
            float(bw.sum()), float(diff.amax()), float(torch.linalg.vector_norm(diff))
            bool(torch.isfinite(bw).all()), bool(torch.allclose(bw, aw))
        words = b.reshape(-1).view(torch.uint8)
        int(words.view(torch.int64).sum()), int(words[:3].sum(dtype=torch.int64))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def _forbid_inspection() -> None:
    """The reference process is not dumpable: a process of the same user cannot ``ptrace`` it or read
    its memory through ``/proc`` (root still can: hence the candidate's drop to another user)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------------
# Fork server ("zygote"): imports torch once, then forks one fresh worker per request
# --------------------------------------------------------------------------------------------------
def zygote_main(control_fd: int) -> None:
    """Serve fork requests on a SOCK_SEQPACKET socket until the parent goes away.

    Request (one packet, with three fds attached: the job pipe's read end, the result pipe's write end
    and the worker's end of the pair's link): ``{"id", "tmp", "env", "args"}``. Replies:
    ``{"zygote_ready": true}`` once torch is imported, ``{"spawned": pid, "id"}`` per fork,
    ``{"exited": pid, "code"}`` when a child is reaped (``code`` as ``Popen.returncode``: negative for a
    signal). The zygote never initializes CUDA (a forked CUDA context is unusable); each child does that
    itself after the fork.
    """
    import select

    sock = socket.socket(fileno=control_fd)
    try:
        import torch  # noqa: F401 - the expensive import every child inherits
        import torch._dynamo  # noqa: F401 - wraps torch.manual_seed & co. on import: before any snapshot

        for role in ROLES:
            role_module(role)
    except BaseException as exc:
        sock.send(json.dumps({"zygote_error": describe(exc)}).encode())
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
        ready, _, _ = select.select([sock], [], [], 0.005)  # also how soon an exit is reported
        if not ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
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
        close_fds(fds)
        sock.send(json.dumps({"spawned": pid, "id": request["id"]}).encode())
    os._exit(0)


def _forked_worker(sock, request: dict, fds: list[int]) -> None:
    """In a fresh fork of the zygote: become a sandboxed worker (own session, dir, env, stdio, fds)."""
    job_fd, result_fd, link_fd = fds
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
        if fd not in (0, 1, 2, result_fd, link_fd):
            try:
                os.close(fd)
            except OSError:
                pass
    os.environ.clear()
    os.environ.update(request["env"])
    if "PYTHONPATH" not in request["env"]:  # what the zygote's PYTHONPATH put on sys.path goes too
        package_root = os.path.dirname(os.path.dirname(HERE))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != package_root]
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # re-read TMPDIR
    random.seed()
    argv = ["--result-fd", str(result_fd), "--link-fd", str(link_fd), *request["args"]]
    sys.argv = [os.path.abspath(__file__), *argv]
    worker_main(_parser().parse_args(argv))


if __name__ == "__main__":
    main()
