"""The candidate process of an evaluation: runs ``ModelNew`` as the reference process asks, nothing more.

Loaded by ``_harness.py`` (by path) in the candidate worker. It never receives the reference model, the
reference outputs, the nonce of the result line or the timing lock: what it builds from is

- the task's input functions: the task source with its ``Model`` class replaced by a stand-in that
  records any use (a candidate that goes looking for the reference finds only the stand-in, and is
  reported), executed *before* the candidate is imported;
- seeds: the correctness inputs are ``get_inputs()`` under ``seed + t`` (as in the reference process,
  which checks their checksums), the timing inputs under random seeds it learns only when each input
  set is first used.

It holds what the reference process's memory plan gives it (``setup``'s ``memory``: on CUDA a cap on
what its allocator may reserve, ``torch.cuda.set_per_process_memory_fraction``; lean calls without
copies of the inputs; trials freed once run outside the default layout).

It answers requests on the link (``ping``, ``setup``, ``make``, ``build``, ``trial``, ``checks``,
``warmup``, ``block``, ``verify``, ``finish``) and reports what it sees of the candidate's behaviour
(input writes, replaced torch functions, busy Python threads, use of the stand-in) as flags. Everything
here runs in the candidate's own process, so these reports are a courtesy, not a defence: the reference
process decides from what it can check itself (the outputs' bytes, its own clock, the candidate
process's CPU time).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
import time
import types

import _autoprofiler_harness as harness

_memory = harness.role_module("memory")
_transport = harness.role_module("transport")

INPUT_MODULE = "_autoprofiler_task_inputs"
CANDIDATE_MODULE = "_autoprofiler_candidate"
STAND_IN_NAME = "_autoprofiler_stand_in"
# Replaced by torch itself with a functools.wraps wrapper of the original: importing torch._dynamo
# (any torch.compile candidate) wraps torch.manual_seed. Not a hack when the wrapper wraps the original.
BENIGN_PATCHES = frozenset({"torch.manual_seed"})
REFERENCE_USED = (
    "the candidate called the reference Model (it found the stand-in: the reference does not run in the "
    "candidate's process)"
)


def serve(job: dict, tools: harness.Tools, channel: harness.Channel, link: harness.Link) -> None:
    """Serve the reference process's requests until ``finish`` or until the link closes."""
    process = CandidateProcess(job, tools, link)
    with tools.no_grad():
        try:
            process.serve()
        except (EOFError, ConnectionError, harness.ProtocolError):
            pass  # the reference process has what it needs, or is gone


class _Stop(Exception):
    """A failure was reported: wait for the reference process to close the link."""


class CandidateProcess:
    def __init__(self, job: dict, tools: harness.Tools, link: harness.Link):
        self.job = job
        self.cfg = job["config"]
        self.tools = tools
        self.link = link
        self.torch = tools.torch
        self.tripwire: list[str] = []
        self.model = None
        self.trials: dict[int, list] = {}
        self.sets: dict[int, list] = {}
        self.retired: dict[int, list] = {}  # checksums of the timing sets retired (rolling sets)
        self.lean = False
        self.full = True
        self.cap: int | None = None  # bytes its allocator may reserve on the device
        self.pending: list = []  # (call index, output) of the last timed block, until "keep" arrives
        self.kept: dict[int, object] = {}
        self.used: set[int] = set()
        self.fds: list[int] = []
        self.calls = 0
        self.ref_mutates = False
        self.snapshot: dict = {}
        self.threads_before: set = set()
        channel = _transport.transport(self.cfg, tools) == "channel"
        self.channel = _transport.OutputChannel(tools) if channel else None  # outputs -> reference process

    # -- protocol ------------------------------------------------------------------------------------
    def serve(self) -> None:
        handlers = {
            "setup": self.setup,
            "make": self.make,
            "ping": lambda msg: self.link.send({"op": "pong"}),
            "build": self.build,
            "trial": self.trial,
            "checks": lambda msg: self.link.send({"op": "checks", "flags": self.flags()}),
            "warmup": self.warmup,
            "block": self.block,
            "verify": self.verify,
            "kept_call": self.kept_call,
            "finish": self.finish,
        }
        while True:
            msg, fds = self.link.recv()
            if msg.get("op") == "block":
                self.fds = fds  # a timing input set shared by the reference process (CPU)
            else:
                harness.close_fds(fds)
            try:
                handlers[msg["op"]](msg)
            except _Stop:
                pass
            if msg["op"] == "finish":
                return

    def fail(self, failure: harness.Failure) -> None:
        self.link.send(
            {
                "op": "failed",
                "kind": failure.kind,
                "error": failure.message,
                "compiled": failure.compiled,
                "out_of_memory": failure.out_of_memory,
            }
        )
        raise _Stop

    def phase(self, name: str) -> None:
        self.link.send({"op": "phase", "phase": name})

    # -- steps -------------------------------------------------------------------------------------
    def setup(self, msg: dict) -> None:
        """Take the memory plan, run the task's input functions (with the stand-in ``Model``) and make
        the inputs of the first group of trials."""
        tools = self.tools
        self.seed = int(msg["seed"])
        self.apply_memory(msg.get("memory") or {})
        try:
            module = harness.load_module(
                INPUT_MODULE,
                msg["input_source"],
                "<task inputs>",
                {STAND_IN_NAME: stand_in_model(self.torch, self.tripwire)},
            )
            self.get_inputs = module.get_inputs
            self.init_inputs = tools.move(module.get_init_inputs())
            digests = self.make_trials([int(t) for t in msg["trials"]])
        except Exception as exc:
            self.fail(self.input_failure(exc))
        self.link.send({"op": "inputs", "init": tools.checksum(self.init_inputs), "trials": digests})

    def make(self, msg: dict) -> None:
        """The inputs of the next group of correctness trials (the memory plan holds fewer than all)."""
        self.ref_mutates = bool(msg.get("ref_mutates", self.ref_mutates))
        try:
            digests = self.make_trials([int(t) for t in msg["trials"]])
        except Exception as exc:
            self.fail(self.input_failure(exc))
        self.link.send({"op": "inputs", "trials": digests})

    def make_trials(self, trials: list[int]) -> list:
        tools = self.tools
        self.trials.clear()
        for t in trials:
            self.trials[t] = tools.make_inputs(self.get_inputs, self.seed + t)
        return [tools.checksum(self.trials[t]) for t in trials]

    def input_failure(self, exc: Exception) -> harness.Failure:
        if _memory.is_oom(self.torch, exc):
            return harness.Failure(
                "runtime_error",
                "the task is too large for this device: the candidate's process ran out of memory making "
                f"the correctness inputs{self.share_text()}: {harness.describe(exc, 600)}",
                compiled=False,
            )
        return harness.Failure("task_error", "the task's inputs failed: " + harness.describe(exc))

    def apply_memory(self, memory: dict) -> None:
        """The memory plan's part for this process. On CUDA the allocator is capped at its share of the
        budget, so a candidate that needs more fails here (``runtime_error``) instead of taking memory
        the reference process counts on (the candidate could lift the cap: the plan's limit)."""
        self.lean = bool(memory.get("lean", False))
        self.full = bool(memory.get("full", True))
        cap = memory.get("cap_bytes")
        if self.tools.is_cuda and isinstance(cap, int) and cap > 0:
            torch = self.torch
            index = torch.device(self.tools.device).index  # the setter wants an index ("cuda" has none)
            device = torch.cuda.current_device() if index is None else index
            total = torch.cuda.mem_get_info(device)[1]
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
            self.cap = cap

    def share_text(self) -> str:
        return f" (its share of device memory: {_memory.gib(self.cap)} GiB)" if self.cap else ""

    def classify(self, exc: BaseException, kind: str, where: str, compiled: bool = True) -> harness.Failure:
        """``harness.classify``, saying the process's share of device memory when an allocation failed
        (every failure of candidate code goes through here, so the reference process can tell an
        allocation failure at a share other evaluations shrank)."""
        failure = harness.classify(exc, kind, where, compiled=compiled)
        if self.cap and _memory.is_oom(self.torch, exc):
            failure.message += self.share_text()
            failure.out_of_memory = True
        return failure

    def build(self, msg: dict) -> None:
        """Import the candidate and construct ``ModelNew`` (the build step: ``load_inline`` compiles)."""
        tools = self.tools
        self.ref_mutates = bool(msg["ref_mutates"])
        self.snapshot = torch_snapshot(self.torch)
        self.threads_before = {t.ident for t in threading.enumerate()}
        hide_package()
        self.phase("loading the candidate")
        try:
            module = harness.load_module(
                CANDIDATE_MODULE, self.job["candidate_source"], harness.CANDIDATE_FILENAME
            )
            model_cls = getattr(module, "ModelNew", None)
            if model_cls is None:
                raise harness.Failure(
                    "compile_error", "the candidate module defines no ModelNew", compiled=False
                )
            self.phase("constructing ModelNew")
            tools.seed(self.seed)
            model = model_cls(*tools.clone_all(self.init_inputs))
            if isinstance(model, self.torch.nn.Module):
                model = model.to(tools.device)
            tools.sync()
        except BaseException as exc:
            if self.tripwire:
                self.fail(harness.Failure("suspicious", REFERENCE_USED, compiled=False))
            self.fail(self.classify(exc, "compile_error", "building the candidate", compiled=False))
        if self.tripwire:
            self.fail(harness.Failure("suspicious", REFERENCE_USED))
        self.model = model
        self.link.send({"op": "built"})

    def trial(self, msg: dict) -> None:
        """One correctness trial on a copy of trial ``t``'s inputs; the outputs go back in a memfd."""
        tools = self.tools
        t = int(msg["t"])
        inputs = self.trials[t]
        before = tools.checksum(inputs) if self.lean else None  # lean: no copy, a checksum
        mine = inputs if self.lean else tools.clone_all(inputs)
        try:
            out = self.model(*mine)
            tools.sync()
            t0 = time.perf_counter()
            transport, fds = self.pack_outputs(tools.flatten(out))
            pack_s = time.perf_counter() - t0
        except BaseException as exc:
            self.fail(self.classify(exc, "runtime_error", f"correctness trial {t}"))
        del out
        flags = [REFERENCE_USED] if self.tripwire else []
        if self.lean:
            changed = tools.checksum(inputs) != before
        else:
            changed = not tools.same_inputs(inputs, mine)
        if not self.ref_mutates and changed:
            flags.append(f"trial {t}: the candidate modified its inputs (the reference does not)")
        if not self.full:  # each trial runs once outside the default layout
            del inputs, mine, self.trials[t]
            _memory.release(tools)
        try:
            self.link.send({"op": "outputs", **transport, "flags": flags, "pack_s": pack_s}, fds)
        finally:
            harness.close_fds(list(fds))

    def warmup(self, msg: dict) -> None:
        """Warm-up calls on the trial inputs (``Tools.rehearse``); starts a timing pass (calls from 0)."""
        tools = self.tools
        self.calls, self.pending, self.kept, self.used = 0, [], {}, set()
        self.sets, self.retired = {}, {}  # a previous pass's sets are not used again
        tools.prepare_timing(int(self.cfg.get("l2_flush_mb", 256)))
        try:
            if msg.get("remake"):  # trial 0's inputs again (the trials were freed)
                warm = [tools.make_inputs(self.get_inputs, self.seed)]
            else:
                warm = [self.trials[t] for t in sorted(self.trials)]
            calls, block, held = int(msg["calls"]), int(msg.get("block", 1)), int(msg.get("held", 0))
            tools.rehearse(self.model, warm, calls, block, held)
            del warm
        except BaseException as exc:
            self.fail(self.classify(exc, "runtime_error", "warm-up"))
        if msg.get("remake"):
            _memory.release(tools)
        self.link.send({"op": "warm"})

    def block(self, msg: dict) -> None:
        """Timed calls, each on the input set the reference process names (made on first use from the
        seed it sends then); each output's checksum is committed in the reply."""
        tools = self.tools
        self.keep(msg["keep"])
        for key in msg.get("retire", []):  # rolling sets: the oldest goes before the new one is made
            inputs = self.sets.pop(int(key), None)
            if inputs is not None and int(key) in self.used:
                self.retired[int(key)] = tools.checksum(inputs)
            del inputs
        calls = [(int(call["set"]), call.get("seed")) for call in msg["calls"]]
        self.used.update(key for key, _ in calls)
        shared = {}  # sets the reference process made and shares (CPU): mapped, not made again
        for call, fd in zip([c for c in msg["calls"] if "shared" in c], self.fds, strict=False):
            shared[int(call["set"])] = (call["shared"], fd)
        self.fds = []

        def make(key, seed):
            if key in shared:
                metas, fd = shared.pop(key)
                return _transport.unpack_tensors(tools, metas, fd, copy=False)
            return tools.make_inputs(self.get_inputs, int(seed))

        try:
            outs, ms, sums, _ = tools.time_block(self.model, calls, self.sets, make)
        except BaseException as exc:
            self.fail(self.classify(exc, "runtime_error", "timing"))
        self.pending = list(enumerate(outs, start=self.calls))
        self.calls += len(outs)
        self.link.send({"op": "timed", "ms": ms, "sums": sums})

    def keep(self, flags: list) -> None:
        """Keep the outputs of the last block's calls the reference process chose (after the fact)."""
        for (index, out), flag in zip(self.pending, flags, strict=False):
            if flag:
                self.kept[index] = out
        self.pending = []

    def verify(self, msg: dict) -> None:
        """The calls whose outputs were kept, how many outputs each has, and each timing set's checksum;
        the outputs themselves follow one call per request (``kept_call``), so the output channel never
        needs to hold more than one call's."""
        tools = self.tools
        self.keep(msg["keep"])
        calls = sorted(self.kept)
        counts = [len(tools.flatten(self.kept[index])) for index in calls]
        sets = {
            str(index): tools.checksum(inputs) for index, inputs in self.sets.items() if index in self.used
        }
        sets.update({str(index): sums for index, sums in self.retired.items()})
        self.link.send({"op": "kept", "calls": calls, "counts": counts, "sets": sets})

    def kept_call(self, msg: dict) -> None:
        """The outputs of one kept timed call, then dropped here."""
        call = int(msg["call"])
        out = self.kept.pop(call, None)
        t0 = time.perf_counter()
        try:
            transport, fds = self.pack_outputs(self.tools.flatten(out) if out is not None else [])
        except BaseException as exc:
            self.fail(self.classify(exc, "runtime_error", "sending the timed outputs"))
        del out
        try:
            self.link.send(
                {"op": "kept_call", "call": call, **transport, "pack_s": time.perf_counter() - t0}, fds
            )
        finally:
            harness.close_fds(list(fds))

    def pack_outputs(self, values: list) -> tuple[dict, tuple[int, ...]]:
        """The message fields and file descriptors that carry ``values`` to the reference process: a
        new sealed memfd, or the output channel (``_transport``; a new memfd only when it grows)."""
        if self.channel is not None:
            metas, fds = self.channel.pack(values)
            return {"meta": metas, "transport": "channel"}, fds
        metas, fd = _transport.pack_tensors(self.tools, values)
        return {"meta": metas}, (fd,)

    def finish(self, msg: dict) -> None:
        flags = []
        running = threads_in_candidate_code(stray_threads(self.threads_before))
        if running:
            names = ", ".join(t.name for t in running[:4])
            flags.append(
                f"the candidate's Python thread(s) ({names}) were still running the candidate's code "
                "when timing ended: they compete with the reference"
            )
        self.link.send({"op": "report", "flags": flags + self.flags(), "peak_reserved_bytes": self.peak()})

    def peak(self) -> int | None:
        """What this process's allocator reserved on the device at most (CUDA; ``None`` on CPU): the
        memory the plan's cap limits, for the reference process's ``memory_plan``."""
        if not self.tools.is_cuda:
            return None
        return int(self.torch.cuda.max_memory_reserved(self.tools.device))

    def flags(self) -> list[str]:
        flags = [REFERENCE_USED] if self.tripwire else []
        changed = changed_torch(self.torch, self.snapshot)
        if changed:
            flags.append("the candidate replaced torch functions: " + ", ".join(changed[:8]))
        return flags


# --------------------------------------------------------------------------------------------------
def stand_in_model(torch, tripwire: list):
    """The class that stands where the task's ``Model`` was: constructing or calling it is recorded."""

    class Model(torch.nn.Module):
        """Stand-in for the reference model, which does not exist in the candidate's process."""

        def __init__(self, *args, **kwargs):
            super().__init__()
            tripwire.append("constructed")

        def forward(self, *args, **kwargs):
            tripwire.append("called")
            raise RuntimeError("the reference Model does not run in the candidate's process")

    Model.__module__ = INPUT_MODULE
    return Model


class _NoPackage(importlib.abc.MetaPathFinder):
    """Refuses ``import autoprofiler`` (the evaluator's own package) inside the candidate's process."""

    def find_spec(self, name, path=None, target=None):
        if name == "autoprofiler" or name.startswith("autoprofiler."):
            raise ImportError("the autoprofiler package cannot be imported by a candidate")
        return None


def hide_package() -> None:
    for name in [n for n in sys.modules if n == "autoprofiler" or n.startswith("autoprofiler.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _NoPackage())


def torch_snapshot(torch) -> dict:
    """Every public callable of torch, torch.nn.functional, torch.Tensor, nn.Module and torch.cuda
    (with its Event and Stream classes), by name."""
    snap = {}
    spaces = [
        ("torch", vars(torch)),
        ("torch.nn.functional", vars(torch.nn.functional)),
        ("torch.Tensor", vars(torch.Tensor)),
        ("torch.nn.Module", vars(torch.nn.Module)),
        ("torch.cuda", vars(torch.cuda)),
        ("torch.cuda.Event", vars(torch.cuda.Event)),
        ("torch.cuda.Stream", vars(torch.cuda.Stream)),
    ]
    for label, ns in spaces:
        for key, value in list(ns.items()):
            if key.startswith("_") or isinstance(value, types.ModuleType) or not callable(value):
                continue
            snap[f"{label}.{key}"] = value
    return snap


def changed_torch(torch, before: dict) -> list[str]:
    """Names whose object changed since ``before``, except torch's own wrappers (``BENIGN_PATCHES``)."""
    after = torch_snapshot(torch)
    changed = []
    for name, old in before.items():
        new = after.get(name, old)
        if new is old:
            continue
        if name in BENIGN_PATCHES and getattr(new, "__wrapped__", None) is old:
            continue
        changed.append(name)
    return sorted(changed)


def stray_threads(before: set) -> list[threading.Thread]:
    """Live Python threads whose ident is not in ``before``."""
    return [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]


def threads_in_candidate_code(threads: list[threading.Thread], samples: int = 3) -> list[threading.Thread]:
    """Threads whose innermost Python frame is in the candidate's source, in any of ``samples`` looks.

    A thread spinning in (or sleeping inside) the candidate's own functions is caught; a pool thread
    waiting in ``threading``/``queue`` code (torch.compile's, Triton's) is not, whatever it ran before.
    """
    found = {}
    if not threads:
        return []
    for i in range(samples):
        frames = sys._current_frames()
        for t in threads:
            frame = frames.get(t.ident)
            if frame is not None and frame.f_code.co_filename == harness.CANDIDATE_FILENAME:
                found[t.ident] = t
        if i + 1 < samples:
            time.sleep(0.005)
    return list(found.values())
