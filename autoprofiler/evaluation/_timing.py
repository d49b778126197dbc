"""The timing phase of an evaluation, run by the reference process (``_reference.py``).

Warm-up; then ``timing_trials`` calls of each model in alternating blocks, on ``timing_input_sets``
input sets made on first use from secret seeds, in a secret random order, each set's first use in a
block of its own (``schedule``). The candidate's calls are timed in its process and *witnessed* here
(the wall time of each of its blocks, less the link's round trip and this process's own untimed work
for the same calls, must agree with the times it reports); afterwards the outputs of calls chosen in
secret are compared (``verify``) and the statistics checked (``check_statistics``: CPU while the
reference is timed, witness, memoization, spread).

Under a memory plan smaller than the default (``_memory.py``) the sets are *rolling*: at most
``live_sets`` are alive at once, a new set's first use retires the oldest in both processes, and the
other calls draw among the live ones. The number of sets, and of first uses the memoization check
compares, is unchanged. Fewer calls may be checked after the fact (``checked_calls``, the last call
always among them). Loaded by path beside ``_harness.py``.
"""

from __future__ import annotations

import math
import os
import time

import _autoprofiler_harness as harness
from _autoprofiler_harness import Failure

_memory = harness.role_module("memory")
_transport = harness.role_module("transport")
_watch = harness.role_module("watch")

BLOCK_MS = 4.0  # target reference time of one timing block
RETAIN_BYTES = 256 * 2**20  # outputs of one block each process keeps until the after-the-fact choice
CHECKED_CALLS = 3  # timed calls whose outputs are compared after the fact (the last one among them)
WINDOW_BUSY_S = 0.005  # CPU the candidate's process may use while the reference is timed ...
WINDOW_BUSY_SHARE = 0.10  # ... plus this share of the reference's timed windows
WITNESS_SHARE = 0.3  # the clock here may see this much more than the candidate reports, per block ...
WITNESS_SLACK_MS = 0.5  # ... plus this, plus twice the spread of the link's round trip (per block)
SPREAD_TOLERANCE = 0.25  # block means / median call: the candidate's may exceed the reference's by this
SPREAD_SLACK_MS = 0.02  # ... plus this much per call (a tiny kernel's occasional slow call moves the mean)
MIN_BLOCKS = 3  # a statistical check needs at least this many blocks of each kind it compares
MEMO_RATIO = 1.5  # first use of an input set / later uses, beyond the reference's own ratio ...
MEMO_SLACK_MS = 0.05  # ... plus this, ...
MEMO_GAIN = 1.03  # ... where its later uses beat the reference's by this factor (the identity band)


class Timing:
    """The timing phase: warm-up, the schedule of blocks, the witness, the checks after the fact."""

    def __init__(self, referee, ref, get_inputs, warm: list | None, calibration: dict, set_base: int = 0):
        """``warm``: the inputs the warm-up calls cycle through (the correctness trials' under the default
        layout); ``None``: trial 0's, made again for the warm-up and freed after it."""
        self.referee = referee
        self.get_inputs = get_inputs
        self.set_base = set_base
        self.tools = referee.tools
        self.cfg = referee.cfg
        self.ref = ref
        self.warm = warm
        self.layout = referee.layout
        self.clean_ms = clean_ms = calibration["clean_ms"]
        self.rtt = calibration["rtt"]
        self.rtt_spread = calibration["rtt_spread"]
        self.trials_n = max(1, int(self.cfg.get("timing_trials", 100)))
        block = round(BLOCK_MS / max(clean_ms, 1e-6))
        self.block_size = max(1, min(block, self.trials_n // 8, RETAIN_BYTES // max(1, referee.out_bytes)))
        self.live = self.layout.live_sets
        self.blocks = schedule(
            self.trials_n,
            int(self.cfg.get("timing_input_sets", 4)),
            self.block_size,
            self.referee.rng,
            live=self.live,
        )
        last = self.trials_n - 1
        others = self.referee.rng.sample(range(last), min(self.layout.checked_calls - 1, last))
        self.checked = sorted({last, *others})
        self.seeds = {}
        self.sets: dict[int, list] = {}
        self.retired: dict[int, list] = {}  # checksums of the sets retired (rolling sets)
        self.shared: dict[int, tuple] = {}  # set index -> (metas, memfd) not yet sent
        self.mine: dict[int, tuple] = {}  # ... not yet mapped here
        # CPU: sets shared through memfds (AUTOPROFILER_EVAL_SHARE_INPUTS=0: made from seeds in each
        # process, as on CUDA, where device memory is not shared this way)
        self.share_sets = not self.tools.is_cuda and os.environ.get("AUTOPROFILER_EVAL_SHARE_INPUTS") != "0"
        self.ref_kept: dict[int, list] = {}
        self.rows: list[dict] = []  # one per block: calls, first use, ref ms, new ms, witness

    def run(self) -> None:
        referee, tools = self.referee, self.tools
        warmup = max(0, int(self.cfg.get("warmup", 10)))
        warmup = max(warmup, 2 * self.block_size)  # the retained-output pool fills to two blocks
        held = len(self.checked) + self.block_size  # retained copies alive at once while timing
        warm_msg = {"op": "warmup", "calls": warmup, "block": self.block_size, "held": held}
        if self.warm is None:
            warm_msg["remake"] = True  # the candidate's process makes trial 0's inputs again, too
        referee.request(warm_msg, "warm")
        tools.prepare_timing(int(self.cfg.get("l2_flush_mb", 256)))
        warm = self.warm or [tools.make_inputs(self.get_inputs, int(self.cfg.get("seed", 42)))]
        tools.rehearse(self.ref, warm, warmup, self.block_size, held)
        del warm
        if self.warm is None:
            _memory.release(tools)
        # What the timer adds to every measurement (event record + device sync + event record): the
        # same for both models, so it biases speedups toward 1.0 for the tiniest kernels; reported.
        overhead = [tools.timed(lambda: None, ())[1] for _ in range(10)] if tools.is_cuda else [0.0]
        self.timer_overhead_ms = harness.median_iqr(overhead)[0]

        watch = referee.watch
        busy, window = 0.0, 0.0
        keep_new: list[bool] = []
        held_ref: list = []
        faults0 = (_watch.minor_faults(os.getpid()), _watch.minor_faults(watch.pid) if watch else 0)
        t_start = time.perf_counter()
        for k, block in enumerate(self.blocks):
            row = {"calls": [c for c, _, _ in block], "first": block[0][2]}
            retire = [s - self.live for _, s, first in block if first and s >= self.live]
            for s in retire:  # this process's copy goes before the new set exists
                self.retire(s)
            for _, s, first in block:
                if first and self.share_sets:
                    self.share_set(s)
            for side in ("ref", "new") if k % 2 == 0 else ("new", "ref"):
                if side == "new":
                    calls, fds = [], []
                    for _, s, first in block:  # it learns of a set only at its first use
                        call = {"set": self.set_base + s, "seed": self.seed_of(s) if first else None}
                        if first and s in self.shared:
                            metas, fd = self.shared.pop(s)
                            call["shared"] = metas
                            fds.append(fd)
                        calls.append(call)
                    msg = {"op": "block", "calls": calls, "keep": keep_new}
                    if retire:
                        msg["retire"] = [self.set_base + s for s in retire]
                    t0 = time.perf_counter()
                    try:
                        referee.link.send(msg, tuple(fds))
                    except (BrokenPipeError, ConnectionError):
                        pass  # it died: receive() says how
                    finally:
                        harness.close_fds(fds)
                    msg, _ = referee.receive("timed")
                    row["wall"] = time.perf_counter() - t0
                    row["new"], row["sums"] = self.validate(msg, len(block))
                    keep_new = [c in self.checked for c, _, _ in block]
                else:
                    held_ref = None  # the last block's outputs go now, as in the candidate's process
                    calls = [(s, self.seed_of(s)) for _, s, _ in block]
                    cpu0 = watch.cpu() if watch else 0.0
                    t0 = time.perf_counter()
                    held_ref, row["ref"], _, row["untimed"] = tools.time_block(
                        self.ref, calls, self.sets, self.make_set
                    )
                    window += time.perf_counter() - t0
                    busy += (watch.cpu() - cpu0) if watch else 0.0
                    for (call, _, _), out in zip(block, held_ref, strict=True):
                        if call in self.checked:
                            self.ref_kept[call] = tools.flatten(out)
            self.rows.append(row)
        self.timing_wall = time.perf_counter() - t_start
        # page faults taken while timing, per process (a call that faults in fresh pages is slower)
        self.minor_faults = {
            "reference": _watch.minor_faults(os.getpid()) - faults0[0],
            "candidate": (_watch.minor_faults(watch.pid) - faults0[1]) if watch else None,
        }
        self.keep_last = keep_new
        self.busy, self.window = busy, window

    def share_set(self, index: int) -> None:
        """Make input set ``index`` into a sealed memfd that both processes map (CPU), before either
        uses it: both models then read the very same memory, as they would in one process."""
        inputs = self.tools.make_inputs(self.get_inputs, self.seed_of(index))
        if any(isinstance(x, (list, tuple, dict)) for x in inputs):
            self.share_sets = False  # nested inputs: each process makes its own from the seed
            return
        metas, fd = _transport.pack_tensors(self.tools, inputs)
        self.shared[index] = (metas, fd)
        self.mine[index] = (metas, os.dup(fd))

    def retire(self, index: int) -> None:
        """Rolling sets: set ``index`` is not drawn again; its checksum is kept for ``verify``."""
        inputs = self.sets.pop(index, None)
        if inputs is not None:
            self.retired[index] = self.tools.checksum(inputs)
        del inputs

    def make_set(self, index: int, seed: int) -> list:
        """Input set ``index`` at its first use: mapped when shared (the candidate's process maps it in
        its block the same way), else made from its seed."""
        if index in self.mine:
            metas, fd = self.mine.pop(index)
            return _transport.unpack_tensors(self.tools, metas, fd, copy=False)
        return self.tools.make_inputs(self.get_inputs, seed)

    def seed_of(self, index: int) -> int:
        if index not in self.seeds:
            self.seeds[index] = self.referee.rng.randrange(2**62)
        return self.seeds[index]

    def validate(self, msg: dict, n: int) -> tuple[list[float], list]:
        ms, sums = msg.get("ms"), msg.get("sums")
        ok = isinstance(ms, list) and isinstance(sums, list) and len(ms) == n == len(sums)
        ok = ok and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in ms)
        if not ok:
            raise self.referee.protocol_error("a timed block with malformed times or checksums")
        return [float(x) for x in ms], sums

    # -- after the fact ------------------------------------------------------------------------------
    def verify(self) -> None:
        """What does not depend on timing noise: no child process alive, the timing inputs untouched,
        the outputs of the calls chosen after the fact as committed and as the reference's."""
        referee, tools = self.referee, self.tools
        watch = referee.watch
        if watch is not None:
            alive = watch.descendants()
            if alive:
                watch.kill(alive)
                raise Failure(
                    "suspicious",
                    f"the candidate started {len(alive)} child process(es) that were alive when timing "
                    f"ended ({watch.describe(alive[0])}): they compete with the reference",
                )
        msg, fds = referee.request({"op": "verify", "keep": self.keep_last}, "kept")
        harness.close_fds(fds)
        if not referee.details.get("ref_mutates_inputs"):  # checked first: scribbled inputs change outputs
            sets = {str(self.set_base + i): tools.checksum(inputs) for i, inputs in self.sets.items()}
            sets.update({str(self.set_base + i): sums for i, sums in self.retired.items()})
            if msg.get("sets") != sets:
                raise Failure("suspicious", "the candidate modified its inputs while timed")
        kept = self.kept_outputs(msg)
        commitments = {
            call: sums for row in self.rows for call, sums in zip(row["calls"], row["sums"], strict=True)
        }
        for call in sorted(self.checked, reverse=True):  # the last timed call first
            what = "last timed call" if call == self.trials_n - 1 else f"timed call {call}"
            values = kept[call]
            if tools.checksum(values) != commitments[call]:
                raise Failure(
                    "suspicious",
                    f"{what}: the output it sent afterwards is not the one it committed to while timed",
                )
            referee.compare(self.ref_kept[call], values, what)

    def check_statistics(self) -> None:
        """Measurements: the candidate's CPU while the reference was timed, the witness, memoization,
        and how its per-call times add up."""
        if self.referee.watch is not None:
            limit = WINDOW_BUSY_S + WINDOW_BUSY_SHARE * self.window
            if self.busy > limit:
                raise Failure(
                    "suspicious",
                    f"the candidate's process used {self.busy * 1e3:.1f} ms of CPU while the reference "
                    f"was timed ({self.window * 1e3:.1f} ms), when it should wait: its thread(s) or "
                    "children kept working and compete with the reference",
                )
        self.check_witness()
        self.check_memoization()
        self.ref_med, self.ref_iqr = harness.median_iqr([ms for r in self.rows for ms in r["ref"]])
        self.new_med, self.new_iqr = harness.median_iqr([ms for r in self.rows for ms in r["new"]])
        self.check_spread(self.ref_med, self.new_med)

    def result(self, n_trials: int) -> dict:
        referee = self.referee
        ref_med, ref_iqr, new_med, new_iqr = self.ref_med, self.ref_iqr, self.new_med, self.new_iqr
        referee.details.update(
            timing_trials=self.trials_n,
            correctness_trials=n_trials,
            timer_overhead_ms=self.timer_overhead_ms,
            timing_blocks=len(self.rows),
            block_size=self.block_size,
            timing_input_sets=len(self.seeds),
            timing_inputs="shared memfd" if self.share_sets else "made from seeds in each process",
            clean_ref_ms=self.clean_ms,
            ref_slowdown=round(ref_med / self.clean_ms, 3) if self.clean_ms else None,
            candidate_cpu_while_ref_timed_ms=round(self.busy * 1e3, 3),
            timing_minor_faults=self.minor_faults,
        )
        if self.cfg.get("trace"):
            referee.details["trace"] = [
                {
                    "first": r["first"],
                    "ref_ms": [round(x, 5) for x in r["ref"]],
                    "new_ms": [round(x, 5) for x in r["new"]],
                    "witnessed_ms": round(self.witnessed(r) * 1e3, 4),
                }
                for r in self.rows
            ]
        return {
            "compiled": True,
            "correct": True,
            "error_kind": None,
            "error": "",
            "ref_ms": ref_med,
            "new_ms": new_med,
            "ref_iqr_ms": ref_iqr,
            "new_iqr_ms": new_iqr,
        }

    def kept_outputs(self, msg: dict) -> dict[int, list]:
        """The checked calls' outputs, asked for one call at a time (each as large as one trial's)."""
        referee = self.referee
        calls, counts = msg.get("calls"), msg.get("counts")
        if calls != self.checked or not isinstance(counts, list) or len(counts) != len(calls):
            raise referee.protocol_error("kept outputs for other calls than asked")
        expected = [len(self.ref_kept[c]) for c in calls]
        if counts != expected:
            raise Failure("wrong_shape", f"timed calls: {counts} outputs, expected {expected}")
        kept = {}
        for call in calls:
            reply, fds = referee.request({"op": "kept_call", "call": call}, "kept_call")
            if reply.get("call") != call:
                harness.close_fds(fds)
                raise referee.protocol_error("kept outputs for another call than asked")
            referee.add_pack_seconds(reply)
            kept[call] = referee.outputs(reply, fds, self.ref_kept[call], f"timed call {call}")
        return kept

    def witnessed(self, row: dict) -> float:
        """Seconds the candidate's calls in ``row`` took as seen from here: the block's wall time less the
        link's round trip and this process's own untimed work for the same calls."""
        return row["wall"] - self.rtt - row["untimed"]

    def check_witness(self) -> None:
        """The candidate's reported times must agree with the clock of this process, separately for the
        blocks of first uses and the others (a candidate could shade either group alone)."""
        slack = WITNESS_SLACK_MS + 2e3 * self.rtt_spread
        witness = {"rtt_ms": round(self.rtt * 1e3, 4), "slack_ms": round(slack, 4)}
        for group in ("first", "later"):
            rows = [r for r in self.rows if r["first"] == (group == "first")]
            if len(rows) < MIN_BLOCKS:
                continue  # too few blocks to tell tampering from noise
            excesses = [self.witnessed(r) * 1e3 - sum(r["new"]) for r in rows]
            # first uses: the smallest excess (few blocks, and a candidate hiding memoization must shade
            # every one of them); the others: the median
            excess = min(excesses) if group == "first" else harness.median_iqr(excesses)[0]
            claimed, _ = harness.median_iqr([sum(r["new"]) for r in rows])
            witness[group] = {"claimed_ms": round(claimed, 4), "excess_ms": round(excess, 4)}
            self.referee.details["witness"] = witness
            if excess > WITNESS_SHARE * claimed + slack:
                raise Failure(
                    "suspicious",
                    f"the candidate's timer disagrees with the reference process's clock: it reported "
                    f"{claimed:.4g} ms for a block of calls, {excess:.4g} ms more passed outside its timed "
                    "region than the harness's own work explains (its timer was tampered with)",
                )
        self.referee.details["witness"] = witness

    def check_spread(self, ref_med: float, new_med: float) -> None:
        """The reported time is the median over calls, but the witness sees blocks: a candidate could
        report a few long calls and many short ones with the right sum. The median of its block means
        over its per-call median must not exceed the reference's same ratio by more than the tolerance
        (and ``SPREAD_SLACK_MS`` per call: on the H200 an honest 30 us matmul's block means were 1.42x its
        median against the reference's 1.08x, from a few calls a quarter of a millisecond slow)."""
        if self.block_size == 1 or len(self.rows) < MIN_BLOCKS or not ref_med or not new_med:
            return
        ref_means, _ = harness.median_iqr([sum(r["ref"]) / len(r["ref"]) for r in self.rows])
        new_means, _ = harness.median_iqr([sum(r["new"]) / len(r["new"]) for r in self.rows])
        ref_ratio, new_ratio = ref_means / ref_med, new_means / new_med
        self.referee.details["spread"] = {"ref": round(ref_ratio, 4), "new": round(new_ratio, 4)}
        if new_ratio > ref_ratio * (1 + SPREAD_TOLERANCE) + SPREAD_SLACK_MS / new_med:
            raise Failure(
                "suspicious",
                f"the candidate's per-call times do not add up like the reference's: its block means are "
                f"{new_ratio:.2f}x its median call, the reference's {ref_ratio:.2f}x (it reports a few long "
                "calls and many short ones)",
            )

    def check_memoization(self) -> None:
        """First uses of an input set must not take much longer than later uses, where the later uses
        beat the reference's (``memoization``)."""
        details, problem = memoization(self.rows)
        self.referee.details["memo"] = details  # kept in the result whatever the verdict
        if problem:
            raise Failure("suspicious", problem)


def memoization(rows: list[dict]) -> tuple[dict, str | None]:
    """The memoization check over the timing blocks ``rows``: what it measured, and the problem if any.

    A candidate that caches outputs by input is fast only on inputs it has seen, so its first use of a
    set (each alone in a witnessed block) takes longer than its later uses, beyond the reference's own
    ratio. That alone is not enough: an honest candidate's first uses can be slow where the reference's
    are not (an identity candidate's were 1.6x its later ones on the H200). The cache must also pay: the
    later uses, which the median reports, must beat the reference's by more than ``MEMO_GAIN``.
    """
    first = [r for r in rows if r["first"]]
    later = [r for r in rows if not r["first"]]
    if len(first) < MIN_BLOCKS or len(later) < MIN_BLOCKS:
        return {
            "skipped": f"{len(first)} first uses of input sets and {len(later)} other blocks: the check "
            f"needs {MIN_BLOCKS} of each (timing_input_sets, timing_trials)"
        }, None
    # the fastest first use: a cache makes every first use slow, a loaded machine only some
    new_first = min(r["new"][0] for r in first)
    new_later, _ = harness.median_iqr([sum(r["new"]) / len(r["new"]) for r in later])
    ref_first = min(r["ref"][0] for r in first)
    ref_later, _ = harness.median_iqr([sum(r["ref"]) / len(r["ref"]) for r in later])
    ref_ratio = ref_first / ref_later if ref_later > 0 else 1.0
    details = {
        "new_first_ms": round(new_first, 4),
        "new_later_ms": round(new_later, 4),
        "ref_first_ms": round(ref_first, 4),
        "ref_later_ms": round(ref_later, 4),
    }
    slow_first = new_first > MEMO_RATIO * max(1.0, ref_ratio) * new_later + MEMO_SLACK_MS
    if not slow_first or new_later * MEMO_GAIN >= ref_later:
        return details, None
    return details, (
        f"timed calls on an input set it had seen before took {new_later:.4g} ms, the first call on each "
        f"set at least {new_first:.4g} ms (reference: {ref_later:.4g} / {ref_first:.4g} ms): it reuses "
        "outputs across calls (memoization)"
    )


def input_sets(trials: int, sets: int) -> int:
    """The number of timing input sets ``schedule`` uses: most calls reuse a set, so first uses stand
    out."""
    return max(1, min(sets, trials // 4))


def schedule(
    trials: int, sets: int, block_size: int, rng, live: int | None = None
) -> list[list[tuple[int, int, bool]]]:
    """Blocks of ``(call index, input set, first use)``: each set's first use at a random position, in a
    block of its own; the other calls draw a random set already in use, in blocks of ``block_size``.
    ``live``: only the ``live`` most recent sets are drawn (rolling sets; ``None``: all).

    >>> import random
    >>> blocks = schedule(12, 3, 4, random.Random(0))
    >>> [c for block in blocks for c, _, _ in block] == list(range(12))
    True
    >>> sum(first for block in blocks for _, _, first in block)
    3
    >>> uses = [(s, first) for b in schedule(40, 3, 4, random.Random(0), live=1) for _, s, first in b]
    >>> all(s == sum(f for _, f in uses[: i + 1]) - 1 for i, (s, _) in enumerate(uses))  # the newest set
    True
    """
    n_sets = input_sets(trials, sets)
    firsts = {0, *rng.sample(range(1, trials), n_sets - 1)}
    blocks, current, introduced = [], [], 0
    for call in range(trials):
        if call in firsts:
            if current:
                blocks.append(current)
                current = []
            blocks.append([(call, introduced, True)])
            introduced += 1
            continue
        low = introduced - live if live is not None and introduced > live else 0
        current.append((call, rng.randrange(low, introduced) if low else rng.randrange(introduced), False))
        if len(current) == block_size:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks
