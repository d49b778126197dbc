"""The memory plan of one evaluation: what its two processes may hold at once (``_reference.py``).

Both processes of a pair share one device (on CPU, one machine's RAM). The reference process holds its
model, the correctness trials' inputs and outputs, the timing input sets, the outputs kept for the
checks after the fact and (CUDA) the L2 flush buffer; the candidate process holds its own copies of the
same inputs (made from seeds) and its own outputs. The default evaluation holds every correctness trial
at once and every timing input set: for a task with multi-GB inputs that is several times one forward,
in each process.

The reference process measures what one forward costs on the first correctness trial (``Sizes``: bytes
of inputs and outputs, the peak allocated during the call), what the device has (``Budget``), and
``choose`` picks the layout closest to the default that fits (``Layout``): fewer correctness trials
held at once (the reference runs each group just before the candidate does), *lean* calls (no copy of
the inputs around a call: a checksum says whether they changed), fewer timing input sets alive at once
(rolling: a new set replaces the oldest, so the number of sets and of their first uses, which the
memoization check compares, stays the same), fewer outputs kept for the checks after the fact. A task
whose default layout fits is evaluated exactly as before. ``needs`` is the model of what each layout
holds; its terms are in ``docs/evaluator.md`` (Memory).

Loaded by path beside ``_harness.py`` (standard library only; torch is passed in).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, replace

SAFETY = 0.85  # share of the free memory both processes together may plan to hold
COMPARE_CHUNK = 2**24  # elements of an output compared at once (bounds the comparison's temporaries)
COMPARE_BYTES_PER_ELEM = 64  # temporaries of a comparison per compared element (float64 copies, masks)
GIB = 2**30
# why the evaluator failed an evaluation that other evaluations on the device crowded out (the raw
# result's ``cause``; ``results.EVALUATOR_CAUSES`` lists the same names for the parent's side)
CANDIDATE_CROWDED_OUT = "candidate_crowded_out"  # the candidate's process at a share others had shrunk
REFERENCE_CROWDED_OUT = "reference_crowded_out"  # the reference process out of memory beside others
NO_ROOM = "no_room"  # no room for the plan beside the others after waiting


@dataclass(frozen=True)
class Sizes:
    """What one forward of the task costs, measured in the reference process on trial 0 (bytes)."""

    inputs: int
    outputs: int
    peak: int  # allocated during one reference call above what was held before it, outputs included
    model: int  # the reference model's parameters and buffers, and the init inputs
    compare: int  # temporaries of comparing one trial's outputs
    flush: int  # the L2 flush buffer (CUDA)
    cuda: bool
    block_outputs: int  # outputs of one timing block each process holds until the next


@dataclass(frozen=True)
class Budget:
    """What the pair may hold (bytes): both processes together, and each alone (``None``: no limit)."""

    pair: int
    process: int | None
    free: int  # what the device (CUDA) or the machine (CPU: MemAvailable) had free when measured
    source: str
    total: int = 0  # the device's (CUDA) or the machine's (CPU: MemTotal) memory; 0: not known


@dataclass(frozen=True)
class Layout:
    """How much of the task each process holds at once. ``full``: the default evaluation (every trial
    held until timing, every timing input set alive, no lean calls)."""

    trials_held: int
    lean: bool
    live_sets: int
    checked_calls: int
    full: bool


def needs(s: Sizes, layout: Layout, n_trials: int) -> tuple[int, int]:
    """Peak bytes of (reference process, candidate process) under ``layout``: the largest of its phases.

    >>> s = Sizes(inputs=100, outputs=100, peak=100, model=0, compare=0, flush=0, cuda=True,
    ...           block_outputs=100)
    >>> needs(s, Layout(5, False, 3, 3, True), 5)
    (1400, 1100)
    >>> needs(s, Layout(1, True, 1, 1, False), 5)
    (300, 200)
    """
    i, o, m, k = s.inputs, s.outputs, s.model, s.compare
    p = max(s.peak, s.outputs)
    recv = o if s.cuda else 2 * o  # the candidate's outputs in the reference process (CPU: + the memfd)
    pack = 0 if s.cuda else o  # the candidate's outputs in a memfd (host memory on CUDA)
    h, v, r = layout.trials_held, layout.live_sets, layout.checked_calls
    trial_inputs = n_trials * i if layout.full else 0  # kept for the warm-up (default layout only)
    # a block's outputs are held until the next block of the same process (during its last call one of
    # them is the call's own peak); the checked calls' outputs from when each is made, the last call's
    # being among the block's
    timing = trial_inputs + v * i + (r - 1) * o + s.block_outputs - o + p + s.flush
    warm = 0 if layout.full else i + p + s.flush  # the warm-up's inputs, made again and freed
    ref_call = p if layout.lean else i + max(p, 2 * o)  # a copy of the inputs; outputs copied after
    share = 0 if s.cuda else i  # CPU: a new timing set is made here, then copied into the memfd shared
    reference = m + max(
        (h - 1) * (i + o) + i + ref_call,  # running the reference
        h * (i + o) + max(p, recv + k) + s.flush,  # calibration, correctness trials
        timing + share,
        warm,
        trial_inputs + v * i + r * (o + recv) + k + s.flush,  # checking the timed calls
    )
    candidate = m + max(
        h * i + (p if layout.lean else i + p) + pack,  # correctness trials
        timing,
        warm,
        trial_inputs + v * i + r * (o + pack) + s.flush,  # sending the kept outputs
    )
    return reference, candidate


def fits(need: tuple[int, int], budget: Budget) -> bool:
    reference, candidate = need
    alone = budget.process is None or max(reference, candidate) <= budget.process
    return alone and reference + candidate <= budget.pair


def choose(s: Sizes, budget: Budget, n_trials: int, n_sets: int, checked: int) -> Layout | None:
    """The layout closest to the default that fits ``budget``; ``None`` when not even the smallest does.

    Kept longest: the outputs checked after the fact, then the timing input sets alive at once, then
    copies around calls (lean is weaker only for a reference that permutes its inputs in place), then
    the trials held at once (fewer costs only overlap between the processes).

    >>> s = Sizes(100, 100, 100, 0, 0, 0, True, 100)
    >>> choose(s, Budget(2600, None, 0, ""), 5, 3, 3).full
    True
    >>> choose(s, Budget(1300, None, 0, ""), 5, 3, 3)
    Layout(trials_held=3, lean=False, live_sets=2, checked_calls=3, full=False)
    >>> choose(s, Budget(499, None, 0, ""), 5, 3, 3) is None
    True
    """
    for r in range(checked, 0, -1):
        for v in range(n_sets, 0, -1):
            for lean in (False, True):
                for h in range(n_trials, 0, -1):
                    full = (r, v, lean, h) == (checked, n_sets, False, n_trials)
                    layout = Layout(h, lean, v, r, full)
                    if fits(needs(s, layout, n_trials), budget):
                        return layout
    return None


def smallest() -> Layout:
    return Layout(trials_held=1, lean=True, live_sets=1, checked_calls=1, full=False)


# --------------------------------------------------------------------------------------------------
# Measurements (in the reference process)
# --------------------------------------------------------------------------------------------------
def tensor_bytes(tools, obj) -> int:
    return sum(t.numel() * t.element_size() for t in tools.flatten(obj) if isinstance(t, tools.Tensor))


def model_bytes(tools, model, init_inputs) -> int:
    """Parameters and buffers of ``model`` (when a module) and the init inputs' tensors."""
    total = tensor_bytes(tools, list(init_inputs))
    if isinstance(model, tools.torch.nn.Module):
        total += sum(t.numel() * t.element_size() for t in model.parameters())
        total += sum(t.numel() * t.element_size() for t in model.buffers())
    return total


def compare_bytes(tools, outputs: list) -> int:
    largest = max((t.numel() for t in outputs if isinstance(t, tools.Tensor)), default=0)
    return COMPARE_BYTES_PER_ELEM * min(largest, COMPARE_CHUNK)


class PeakMeter:
    """Bytes allocated during a call above what was held when ``start`` ran: CUDA from the caching
    allocator's peak; CPU from the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``),
    ``None`` where that cannot be reset."""

    def __init__(self, tools):
        self.tools = tools
        self.base: int | None = None

    def start(self) -> None:
        tools = self.tools
        if tools.is_cuda:
            tools.torch.cuda.reset_peak_memory_stats(tools.device)
            self.base = tools.torch.cuda.memory_allocated(tools.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current resident set
            self.base = proc_status_bytes("VmRSS")
        except OSError:
            self.base = None

    def peak(self) -> int | None:
        if self.base is None:
            return None
        if self.tools.is_cuda:
            return max(0, self.tools.torch.cuda.max_memory_allocated(self.tools.device) - self.base)
        return max(0, proc_status_bytes("VmHWM") - self.base)


def measure_budget(tools, held: int, budget_gb: float | None) -> Budget:
    """What the pair may hold, ``held`` being what the reference process's tensors take now (part of
    what it plans to hold, so counted back in).

    CUDA: ``SAFETY`` x (the device's free memory after emptying this process's cache + ``held``); no
    per-process limit (none exists on the GPU). CPU: ``SAFETY`` x (MemAvailable + ``held``), and each
    process ``SAFETY`` x (its ``RLIMIT_AS`` less what this process maps besides its tensors). A set
    ``budget_gb`` (``EvalConfig.memory_budget_gb``) caps the pair's budget.
    """
    torch = tools.torch
    process = None
    if tools.is_cuda:
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(tools.device)
        source = f"{SAFETY:g} x (free device memory + the reference process's tensors)"
    else:
        free, total = meminfo_bytes("MemAvailable"), meminfo_bytes("MemTotal")
        source = f"{SAFETY:g} x (MemAvailable + the reference process's tensors)"
        limit, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if limit != resource.RLIM_INFINITY:
            overhead = max(0, proc_status_bytes("VmSize") - held)
            process = max(0, int(SAFETY * (limit - overhead)))
            source += f"; each process {SAFETY:g} x (RLIMIT_AS - {overhead / GIB:.2f} GiB of other mappings)"
    pair = int(SAFETY * (free + held))
    if budget_gb is not None:
        pair = min(pair, int(float(budget_gb) * GIB))
        source += f"; at most memory_budget_gb = {float(budget_gb):g}"
    return Budget(pair=pair, process=process, free=free, source=source, total=int(total))


def beside(budget: Budget, reserved: int, others: int, held: int = 0) -> Budget:
    """``budget`` beside ``others`` live evaluations on the same device that reserved ``reserved``
    bytes (``_ledger``), whatever is free now (they may not have allocated yet): at most ``SAFETY`` x
    what the device has beyond what the ledger accounts for, less their reservations.

    The ledger holds tensors' bytes only. What else is in use on the device now, beyond ``held`` (this
    process's tensors) and the others' reservations, is memory no plan counts: every process's CUDA
    context (about 0.7 GiB each on an H100: 15 GiB for 22 processes), spare workers, caches, other
    programs. It is taken off the device's memory before ``SAFETY`` applies. (A lower bound: what the
    others have not allocated yet hides as much of it.)

    >>> b = Budget(pair=60 * GIB, process=None, free=50 * GIB, source="", total=80 * GIB)
    >>> beside(b, 20 * GIB, 2, held=2 * GIB).pair // GIB  # 8 GiB unseen: 0.85 x 72 - 20
    41
    >>> beside(b, 0, 0).pair // GIB  # nothing else in the ledger: the budget as measured
    60
    """
    if not others or not budget.total:
        return budget
    unseen = max(0, budget.total - budget.free - held - reserved)
    room = max(0, int(SAFETY * (budget.total - unseen)) - reserved)
    source = (
        f"{budget.source}; at most {SAFETY:g} x ({gib(budget.total)} GiB less {gib(unseen)} GiB in use "
        f"outside the ledger) less {gib(reserved)} GiB reserved by {others} other "
        f"evaluation{'s' if others != 1 else ''} on the device"
    )
    return replace(budget, pair=min(budget.pair, room), source=source)


def headroom(s: Sizes) -> int:
    """Room the candidate's process may take beyond the reference's model (``needs``) beside other
    evaluations: one more copy of the inputs and one more forward (a ``channels_last`` copy of the
    inputs, a CUDA graph's static inputs and memory pool, ``torch.compile``'s buffers). On an H100,
    such rewrites ran out of memory at a share sized to the model while the reference's own code
    (``keep``) never did.

    >>> headroom(Sizes(100, 40, 70, 0, 0, 0, True, 40))
    170
    """
    return s.inputs + max(s.peak, s.outputs)


def roomy(budget: Budget, head: int) -> Budget:
    """``budget`` less the candidate's headroom ``head``: a layout chosen in it leaves the candidate,
    beside other evaluations, its model plus the whole headroom (``candidate_share`` then caps it there
    instead of at whatever the budget has left).

    >>> roomy(Budget(pair=10 * GIB, process=None, free=0, source="s"), 3 * GIB).pair // GIB
    7
    """
    return replace(budget, pair=max(0, budget.pair - head))


def choose_leaving(
    s: Sizes, budget: Budget, head: int, counts: tuple[int, int, int], alone: bool
) -> Layout | None:
    """The layout ``choose`` picks in ``roomy(budget, head)``: one that leaves the candidate its model
    plus its whole headroom. Alone on the device, where no other evaluation will give memory back, a
    task no such layout fits takes the layout ``choose`` picks in the whole budget (its candidate then
    gets what is left); beside others it waits for room instead (``None`` here).

    >>> s = Sizes(100, 100, 100, 0, 0, 0, True, 100)
    >>> choose_leaving(s, Budget(2600, None, 0, ""), 200, (5, 3, 3), alone=True).full  # leaner
    False
    >>> choose_leaving(s, Budget(600, None, 0, ""), 200, (5, 3, 3), alone=True).trials_held
    1
    >>> choose_leaving(s, Budget(600, None, 0, ""), 200, (5, 3, 3), alone=False) is None
    True
    """
    layout = choose(s, roomy(budget, head), *counts)
    if layout is None and alone:
        return choose(s, budget, *counts)
    return layout


def candidate_share(need: tuple[int, int], pair: int, head: int, crowded: bool) -> tuple[int, int]:
    """(the candidate process's cap, the bytes the pair reserves in the ledger) for a plan that needs
    ``need`` in a budget of ``pair``. Alone on the device the candidate may take all of the budget that
    the reference process leaves (so a candidate that fails alone fails for its own reasons), and the
    pair reserves its model plus ``head``; beside others it may take its model plus ``head`` and
    reserves exactly that, so that no evaluation plans into memory another's candidate may use.

    >>> candidate_share((100, 200), 1000, 50, crowded=False), candidate_share((100, 200), 1000, 50, True)
    ((900, 350), (250, 350))
    >>> candidate_share((100, 200), 320, 50, crowded=True)  # the budget is all there is
    (220, 320)
    """
    room = pair - need[0]
    wanted = min(room, need[1] + head)
    return (wanted if crowded else room), need[0] + wanted


def alone(budget: Budget, budget_gb: float | None) -> Budget:
    """``budget`` as it would be with nothing else on the device: ``SAFETY`` x the device's memory
    (capped by ``memory_budget_gb``), never less than ``budget``. Other evaluations shrink a budget
    twice: by what they hold (``measure_budget`` sees less free memory) and by what they reserved and
    have not allocated yet (``beside``); a candidate crowded out by either is judged against this.

    >>> alone(Budget(pair=20 * GIB, process=None, free=24 * GIB, source="", total=80 * GIB), None).pair // GIB
    68
    """
    if not budget.total:
        return budget
    pair = int(SAFETY * budget.total)
    if budget_gb is not None:
        pair = min(pair, int(float(budget_gb) * GIB))
    return replace(budget, pair=max(pair, budget.pair))


def crowded_out(cap: int | None, alone_cap: int | None, others: int) -> str | None:
    """Why the candidate's process running out of memory at its share ``cap`` is the evaluator's
    fault, or ``None`` when it is the candidate's: the share was smaller than it would have been alone
    (``alone_cap``, from ``alone``) because ``others`` evaluations on the device held or had reserved
    memory. Alone the candidate might have fitted, so its failure says nothing about it; a later
    evaluation, with fewer beside it, decides (the recording evaluates such cells again, last alone).

    >>> crowded_out(21 * GIB, 60 * GIB, 5) is not None, crowded_out(60 * GIB, 60 * GIB, 0)
    (True, None)
    """
    if not cap or not alone_cap or alone_cap <= cap:
        return None
    return (
        f"the candidate's process ran out of memory at its share of {gib(cap)} GiB, which {others} other "
        f"evaluation{'s' if others != 1 else ''} on the device had shrunk from {gib(alone_cap)} GiB alone: "
        "not the candidate's fault, so nothing is recorded and a resumed run evaluates it again"
    )


def beside_now(cap: int | None, others: int) -> str | None:
    """Why the candidate's process running out of memory at its share ``cap`` is the evaluator's fault
    when ``others`` evaluations are on the device at the time, whatever its plan saw: they may have
    filled the device while it was within its share (on an H100, 15 of 36 such failures were an
    allocation larger than the device had free). ``None`` when it was alone, or had no share.

    >>> beside_now(13 * GIB, 2) is not None, beside_now(13 * GIB, 0), beside_now(None, 2)
    (True, None, None)
    """
    if not cap or not others:
        return None
    return (
        f"the candidate's process ran out of memory at its share of {gib(cap)} GiB while {others} other "
        f"evaluation{'s' if others != 1 else ''} on the device may have filled it: not the candidate's "
        "fault, so nothing is recorded and a resumed run evaluates it again"
    )


def proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def meminfo_bytes(field: str) -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/meminfo has no {field}")


def is_oom(torch, exc: BaseException) -> bool:
    """An allocation that failed: CUDA's ``OutOfMemoryError``, ``MemoryError``, the CPU allocator's
    refusal (under ``RLIMIT_AS``)."""
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, (MemoryError, oom)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "DefaultCPUAllocator" in text
    )


def release(tools) -> None:
    """Give cached device memory back between phases (the other process of the pair may need it)."""
    if tools.is_cuda:
        tools.torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------
# What the result says
# --------------------------------------------------------------------------------------------------
def gib(n: int | float) -> str:
    return f"{n / GIB:.3g}"


def describe(s: Sizes, budget: Budget, layout: Layout | None, need: tuple[int, int], peak_measured: bool):
    """``details["memory_plan"]``: the measured sizes, the budget, the layout and what it needs."""
    plan = {
        "input_bytes": s.inputs,
        "output_bytes": s.outputs,
        "peak_bytes": max(s.peak, s.outputs),
        "peak": "measured" if peak_measured else "not measurable here: the outputs' bytes",
        "model_bytes": s.model,
        "budget_bytes": budget.pair,
        "process_limit_bytes": budget.process,
        "free_bytes": budget.free,
        "budget": budget.source,
        "reference_bytes": need[0],
        "candidate_bytes": need[1],
    }
    if layout is not None:
        plan.update(
            default=layout.full,
            trials_held=layout.trials_held,
            lean=layout.lean,
            live_sets=layout.live_sets,
            checked_calls=layout.checked_calls,
        )
    return plan


def too_large(s: Sizes, budget: Budget, need: tuple[int, int]) -> str:
    """The error of a task that does not fit even one trial and one timing input set at a time."""
    reference, candidate = need
    text = (
        f"the task is too large for this device: one evaluation needs {gib(reference + candidate)} GiB "
        f"(reference process {gib(reference)}, candidate process {gib(candidate)} GiB, holding one "
        f"correctness trial and one timing input set at a time; one forward: {gib(s.inputs)} GiB of "
        f"inputs, {gib(max(s.peak, s.outputs))} GiB during the call), {gib(budget.pair)} GiB available "
        f"({gib(budget.free)} GiB free; {budget.source})"
    )
    if budget.process is not None and max(reference, candidate) > budget.process:
        text += f"; each process may hold {gib(budget.process)} GiB"
    return text
