"""The reference process of an evaluation: the reference model, its outputs, the clock and the verdict.

Loaded by ``_harness.py`` (by path) in the reference worker, which never runs candidate code. Steps
(each announced to the parent as a phase):

1. load the task, construct ``Model`` (seeded);
2. run the reference on the correctness inputs (``seed + t``), trial 0 first: what it allocates and
   what the device has free give the memory plan (``_memory.py``: how many trials, timing input sets
   and checked outputs each process holds at once; a task too large for the device stops here with a
   ``runtime_error``); send the candidate process the task's input functions (``input_source``:
   ``Model`` replaced by a stand-in), the seed and its part of the plan; check that it built the very
   same inputs (checksums); measure the link's round trip (the candidate is not imported yet, so this
   is the harness's own latency) and a clean reference time;
3. ``build``: the candidate process imports the candidate and constructs ``ModelNew``;
4. correctness: each trial's outputs come back in a sealed memfd and are compared here
   (``_compare.py``: shape, dtype, NaN/Inf, ``allclose``, relative error norm); then the candidate
   process's own flags. Trials beyond the plan's first group are made (in both processes) and run by
   the reference just before their turn;
5. timing (``_timing.py``), under the optional ``timing_lock`` (held by this process only): a quiet
   window in which the candidate process and its children must use no CPU (busy ones are ``suspicious``,
   idle children are killed); warm-up; then ``timing_trials`` calls of each model in alternating blocks.
   The calls run on ``timing_input_sets`` input sets made on first use from secret seeds, in a secret
   random order, each set's first use in a block of its own. The candidate's calls are timed in its
   process (CUDA events / ``perf_counter``) and *witnessed* here: the wall time of each of its blocks,
   less the link's round trip and this process's own untimed work for the same calls, must agree with
   the times it reports; its process must use no CPU while the reference is timed; no child process may
   be alive at the end;
6. after the fact: the outputs of three timed calls chosen in secret (the last one among them; fewer
   under a small memory plan) must match what the candidate committed to (checksums sent with each
   block) and the reference outputs; the first use of an input set must not take much longer than later
   uses (memoization).

Reported times are medians over blocks of the per-call mean within each block, so a candidate cannot
lower its median by moving time between the calls of one witnessed block.
"""

from __future__ import annotations

import ast
import contextlib
import math
import random
import time

import _autoprofiler_harness as harness
from _autoprofiler_harness import Failure

_watch = harness.role_module("watch")
ProcessWatch, SharedCores, TimingLock = _watch.ProcessWatch, _watch.SharedCores, _watch.TimingLock
_memory = harness.role_module("memory")
_ledger = harness.role_module("ledger")
_transport = harness.role_module("transport")
_compare = harness.role_module("compare")
_timing = harness.role_module("timing")
Timing, schedule, input_sets = _timing.Timing, _timing.schedule, _timing.input_sets
BLOCK_MS, RETAIN_BYTES, CHECKED_CALLS = _timing.BLOCK_MS, _timing.RETAIN_BYTES, _timing.CHECKED_CALLS

TASK_MODULE = "_autoprofiler_reference_task"
# Kinds a candidate process may report about itself (anything else it sends is a runtime_error).
CANDIDATE_KINDS = ("compile_error", "runtime_error", "crashed", "suspicious")
BUILD_PHASES = ("loading the candidate", "constructing ModelNew")

LEDGER_WAIT = 0.25  # share of timeout_s a plan may wait for room beside other evaluations
LEDGER_POLL_S = 0.25  # how often it looks again
CLEAN_CALLS = 5  # reference calls timed before the candidate exists (the first two are warm-up)
CALIBRATION_BLOCKS = 12  # reference blocks, each followed by a round trip on the link, before the build
# (never after it, so not for the second timing attempt either: a built candidate could answer late)
# The link's spread is its round trips' 75th percentile less their median: the witness checks medians (and
# minima) of blocks, so its slack needs the typical spread, and one slow round trip on a loaded machine
# must not widen it by milliseconds (docs/evaluator.md, "Witness", has the measurement).
SPREAD_PERCENTILE = 75
# the timing thresholds are at the top of _timing.py


def serve(job: dict, tools: harness.Tools, channel: harness.Channel, link: harness.Link) -> None:
    """Evaluate, then write the result line (with the job's nonce) on the result channel."""
    referee = Referee(job, tools, channel, link)
    with tools.no_grad():
        try:
            result = referee.run()
        except Failure as f:
            result = referee.failed(f)
        except BaseException as exc:
            if _memory.is_oom(referee.torch, exc):
                result = referee.out_of_memory(exc)
            else:
                result = {
                    "compiled": referee.built,
                    "correct": False,
                    "error_kind": "evaluator_error",
                    "error": f"the reference process failed during {referee.phase_name}: "
                    + harness.describe(exc),
                }
    result.setdefault("details", {}).update(referee.details)
    channel.send({"nonce": job.get("nonce"), "result": result})


class Referee:
    def __init__(self, job: dict, tools: harness.Tools, channel: harness.Channel, link: harness.Link):
        self.job = job
        self.cfg = job["config"]
        self.tools = tools
        self.torch = tools.torch
        self.channel = channel
        self.link = link
        self.phase_name = "starting"
        self.phase_t0 = time.perf_counter()
        self.built = False
        self.watch = ProcessWatch(int(job["candidate_pid"])) if job.get("candidate_pid") else None
        self.rng = random.SystemRandom()
        self.details: dict = {"torch": self.torch.__version__, "reference_worker": job.get("worker", {})}
        self.comparer = _compare.Comparer(tools, self.cfg)
        self.ref_mutates = False
        self.call_peak: int | None = None  # bytes one reference call allocated (trial 0)
        self.layout = None  # the memory plan's layout (``plan_memory``), made on trial 0
        self.candidate_memory: dict = {}
        # (other evaluations, the candidate's share without them) when their reservations shrank the plan
        self.beside: tuple[int, int] | None = None
        self.out_bytes = 0
        channel = _transport.transport(self.cfg, tools) == "channel"
        self.mapping = _transport.OutputMapping(tools) if channel else None  # the candidate's output channel
        if tools.is_cuda:
            self.details["device_name"] = self.torch.cuda.get_device_name(tools.device)

    # -- link helpers --------------------------------------------------------------------------------
    def phase(self, name: str) -> None:
        now = time.perf_counter()
        if self.phase_name != "starting":
            key = "correctness" if self.phase_name.startswith("correctness trial") else self.phase_name
            spent = self.details.setdefault("phase_s", {})
            spent[key] = round(spent.get(key, 0.0) + now - self.phase_t0, 4)
        self.phase_name, self.phase_t0 = name, now
        self.channel.phase(name)

    def receive(self, expect: str) -> tuple[dict, list[int]]:
        """The candidate process's next answer, which must be ``expect`` (phases are relayed)."""
        while True:
            try:
                msg, fds = self.link.recv()
            except (EOFError, ConnectionError) as exc:
                failure = Failure(
                    "crashed",
                    f"the candidate's process died during {self.phase_name}",
                    compiled=self.phase_name not in BUILD_PHASES and self.built,
                    candidate_died=True,
                )
                raise failure from exc
            except harness.ProtocolError as exc:
                raise self.protocol_error(str(exc)) from exc
            op = msg.get("op")
            if op == "phase" and not self.built:
                harness.close_fds(fds)
                self.phase(str(msg.get("phase"))[:100])
                continue
            if op == "failed":
                harness.close_fds(fds)
                raise self.candidate_failure(msg)
            if op != expect:
                harness.close_fds(fds)
                raise self.protocol_error(f"expected {expect!r}, got {str(op)[:40]!r}")
            return msg, fds

    def request(self, msg: dict, expect: str) -> tuple[dict, list[int]]:
        try:
            self.link.send(msg)
        except (BrokenPipeError, ConnectionError):
            pass  # it died: receive() says how
        return self.receive(expect)

    def candidate_failure(self, msg: dict) -> Failure:
        kind = msg.get("kind")
        text = str(msg.get("error", ""))[:2000]
        if kind == "task_error" and not self.built:  # its inputs failed before any candidate code ran
            return Failure("task_error", f"in the candidate's process: {text}", compiled=False)
        if kind not in CANDIDATE_KINDS:
            kind = "runtime_error"
        if kind in ("runtime_error", "compile_error") and msg.get("out_of_memory") is True:
            crowded = self.crowded_out()
            if crowded:
                return Failure(
                    "evaluator_error",
                    f"{crowded}: {text}",
                    compiled=self.built,
                    cause=_memory.CANDIDATE_CROWDED_OUT,
                )
        return Failure(kind, text, compiled=self.built or kind == "suspicious")

    def failed(self, f: Failure) -> dict:
        """The result of an evaluation ``f`` ended. When the candidate's process died, the parent reads
        its log; ``crowded`` (set when other evaluations had shrunk its share) lets the parent call a
        death by a failed allocation the evaluator's error."""
        result = {"compiled": f.compiled, "correct": False, "error_kind": f.kind, "error": f.message}
        if f.cause:
            result["cause"] = f.cause
        if f.kind == "crashed" and f.candidate_died:
            result["candidate_died"] = True
            crowded = self.crowded_out()
            if crowded:
                result["crowded"] = crowded
        return result

    def crowded_out(self) -> str | None:
        """Why the candidate's failed allocation is the evaluator's error, or ``None``: its share was
        smaller than alone because of the other evaluations when it was planned
        (``_memory.crowded_out``), or other evaluations are on the device now (``_memory.beside_now``:
        started after the plan, they may have filled the device while the candidate was within its
        share). Either way the cell is evaluated again, last alone, where the failure is its own. The
        text ends with the candidate's plan and headroom, so a log tells a squeezed cap from a full one."""
        cap = self.candidate_memory.get("cap_bytes")
        why = None
        if self.beside is not None:
            others, alone_cap = self.beside
            why = _memory.crowded_out(cap, alone_cap, others)
        why = why or _memory.beside_now(cap, self.others_on_the_device())
        plan = self.details.get("memory_plan", {})
        if why and "candidate_bytes" in plan and "headroom_bytes" in plan:
            model, head = _memory.gib(plan["candidate_bytes"]), _memory.gib(plan["headroom_bytes"])
            why += f" (its plan {model} GiB, headroom {head} GiB)"
        return why

    def protocol_error(self, what: str) -> Failure:
        return Failure("suspicious", f"the candidate's process broke the evaluation protocol: {what}")

    def outputs(self, msg: dict, fds: list[int], reference: list, what: str) -> list:
        """The candidate's outputs (a new memfd, or the output channel: ``_transport``), after checking
        their structure against ``reference``."""
        channel = self.mapping is not None
        if msg.get("transport", "memfd") != ("channel" if channel else "memfd"):
            harness.close_fds(fds)
            raise self.protocol_error(f"outputs by {msg.get('transport')!r}, not the evaluation's transport")
        if len(fds) > 1 or not (channel or fds) or not isinstance(msg.get("meta"), list):
            harness.close_fds(fds)
            raise self.protocol_error("malformed outputs" if channel else "outputs without exactly one memfd")
        try:
            self.check_structure(reference, msg["meta"], what)
        except BaseException:
            harness.close_fds(fds)
            raise
        with self.step_seconds("unpack_outputs_s"):
            try:
                if not channel:
                    return _transport.unpack_tensors(self.tools, msg["meta"], fds[0])  # closes the memfd
                if fds:  # the channel grew: a new memfd replaces the one mapped here
                    need = _memory.tensor_bytes(self.tools, reference)  # its outputs' shapes are checked
                    self.mapping.open(fds[0], limit=2 * need + _transport.CHANNEL_MIN_BYTES)
                    mapping = self.mapping
                    self.details["output_channel"] = {"bytes": mapping.size, "pinned": mapping.pinned}
                return self.mapping.read(msg["meta"])
            except harness.ProtocolError as exc:
                raise self.protocol_error(str(exc)) from exc

    @contextlib.contextmanager
    def step_seconds(self, key: str):
        """Time the block into ``details[key]``, summed over the evaluation (where the time goes)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add_seconds(key, time.perf_counter() - t0)

    def add_seconds(self, key: str, seconds: float) -> None:
        self.details[key] = round(self.details.get(key, 0.0) + seconds, 4)

    def add_pack_seconds(self, msg: dict) -> None:
        """The seconds the candidate's process says it took to pack its outputs (diagnostics only)."""
        pack_s = msg.get("pack_s")
        if isinstance(pack_s, (int, float)) and math.isfinite(pack_s) and pack_s >= 0:
            self.add_seconds("candidate_pack_s", float(pack_s))

    # -- the evaluation ------------------------------------------------------------------------------
    def run(self) -> dict:
        tools, torch, cfg = self.tools, self.torch, self.cfg
        seed = int(cfg.get("seed", 42))
        n_trials = max(1, int(cfg.get("correctness_trials", 5)))

        self.phase("loading the task")
        try:
            task = harness.load_module(TASK_MODULE, self.job["task_source"], "<task>")
            model_cls, get_inputs = task.Model, task.get_inputs
            init_inputs = tools.move(task.get_init_inputs())
            input_source = input_module_source(self.job["task_source"])
            tools.seed(seed)
            ref = model_cls(*tools.clone_all(init_inputs))
            if isinstance(ref, torch.nn.Module):
                ref = ref.to(tools.device)
        except Exception as exc:
            if _memory.is_oom(torch, exc):
                raise  # too large for this device: serve() says so
            raise Failure(
                "task_error", "the task failed to load: " + harness.describe(exc), compiled=False
            ) from exc

        self.phase("running the reference")
        trials = {0: self.first_trial(ref, get_inputs, seed)}
        layout = self.plan_memory(ref, init_inputs, trials[0], n_trials)
        held = list(range(layout.trials_held))
        self.link.send(
            {
                "op": "setup",
                "input_source": input_source,
                "seed": seed,
                "trials": held,
                "memory": self.candidate_memory,
            }
        )
        for t in held[1:]:
            trials[t] = self.reference_trial(ref, get_inputs, seed, t)
        self.details["ref_mutates_inputs"] = self.ref_mutates
        self.check_inputs(trials, held, init_inputs)
        tools.prepare_timing(int(cfg.get("l2_flush_mb", 256)))
        t0 = time.perf_counter()
        calibration = self.calibrate(ref, [trials[t][0] for t in held])
        self.details["calibration_s"] = round(time.perf_counter() - t0, 4)

        self.link.send({"op": "build", "ref_mutates": self.ref_mutates})
        self.phase("loading the candidate")
        self.receive("built")
        self.built = True

        self.correctness(ref, get_inputs, seed, trials, n_trials)
        msg, _ = self.request({"op": "checks"}, "checks")
        self.raise_flags(msg.get("flags"))
        # the default layout warms up on the trials' inputs (kept); the others make trial 0's again
        warm = [trials[t][0] for t in range(n_trials)] if layout.full else None
        trials.clear()  # the reference outputs are compared: not needed any more
        if not layout.full:
            _memory.release(tools)

        self.phase("timing")
        lock = TimingLock(cfg.get("timing_lock"))
        try:  # the evaluator's fault, not the candidate's: reported apart, never a candidate's error
            lock.acquire()
        except OSError as exc:
            raise Failure("evaluator_error", f"timing lock: {harness.describe(exc)}") from exc
        with lock:
            timing = self.time_models(ref, get_inputs, warm, calibration)
        msg, _ = self.request({"op": "finish"}, "report")
        self.raise_flags(msg.get("flags"))
        self.note_candidate_peak(msg.get("peak_reserved_bytes"))
        self.phase("done")
        return timing.result(n_trials)

    # -- correctness trials ----------------------------------------------------------------------------
    def first_trial(self, ref, get_inputs, seed: int) -> tuple[list, list]:
        """Trial 0, as every trial of the default layout (the reference runs on a copy of its inputs,
        its outputs are copied), measuring what one call allocates for the memory plan."""
        tools = self.tools
        meter = _memory.PeakMeter(tools)
        with self.reference_call():
            inputs = tools.make_inputs(get_inputs, seed)
            mine = tools.clone_all(inputs)
            meter.start()
            out = ref(*mine)
            tools.sync()
            self.call_peak = meter.peak()
            self.ref_mutates = not tools.same_inputs(inputs, mine)
            del mine
            return inputs, detach_all(tools, out)

    def reference_trial(self, ref, get_inputs, seed: int, t: int) -> tuple[list, list]:
        """Trial ``t``'s inputs and reference outputs. Lean layouts copy neither: a checksum says whether
        the reference changed its inputs (they are then made again), and an output is copied only
        where it shares memory with the inputs or the model, or is a view of something larger."""
        tools = self.tools
        with self.reference_call():
            inputs = tools.make_inputs(get_inputs, seed + t)
            if not self.layout.lean:
                mine = tools.clone_all(inputs)
                out = ref(*mine)
                tools.sync()
                self.ref_mutates |= not tools.same_inputs(inputs, mine)
                return inputs, detach_all(tools, out)
            before = tools.checksum(inputs)
            out = ref(*inputs)
            tools.sync()
            outs = detach_lean(tools, out, inputs, ref)
            del out
            if tools.checksum(inputs) != before:
                self.ref_mutates = True
                inputs = None
                inputs = tools.make_inputs(get_inputs, seed + t)
            return inputs, outs

    @contextlib.contextmanager
    def reference_call(self):
        """Calls of the reference: a failure is the task's (``task_error``), except an allocation that
        failed, which goes up as it is (too large for this device, or the memory was taken: ``serve``
        says which)."""
        try:
            yield
        except Exception as exc:
            if _memory.is_oom(self.torch, exc):
                raise
            raise Failure(
                "task_error", "the reference failed: " + harness.describe(exc), compiled=False
            ) from exc

    def check_inputs(self, trials: dict, group: list[int], init_inputs=None) -> None:
        """The candidate process's checksums of the inputs it made for ``group`` (and of the init inputs,
        the first time) must be this process's."""
        tools = self.tools
        msg, _ = self.receive("inputs")
        same = msg.get("trials") == [tools.checksum(trials[t][0]) for t in group]
        if init_inputs is not None:
            same = msg.get("init") == tools.checksum(init_inputs) and same
        if same:
            return
        if self.built:  # the first group matched before the candidate was imported: the candidate did it
            raise Failure(
                "suspicious",
                f"the candidate's process made other inputs than the reference's for trials {group} "
                "(they matched before the candidate was imported)",
            )
        raise Failure(
            "task_error",
            "get_inputs()/get_init_inputs() give different values in two processes under the same "
            "seed (they must be reproducible from torch.manual_seed, random.seed or numpy's seed)",
            compiled=False,
        )

    def correctness(self, ref, get_inputs, seed: int, trials: dict, n_trials: int) -> None:
        """The correctness trials, in groups of ``trials_held``: the first group's reference outputs are
        computed before the build, the others' (both processes' inputs made again) just before their
        trials; outside the default layout each trial is freed once compared."""
        layout = self.layout
        for start in range(0, n_trials, layout.trials_held):
            group = list(range(start, min(start + layout.trials_held, n_trials)))
            if start:
                self.phase(f"correctness trial {start}")
                self.link.send({"op": "make", "trials": group, "ref_mutates": self.ref_mutates})
                for t in group:
                    trials[t] = self.reference_trial(ref, get_inputs, seed, t)
                self.details["ref_mutates_inputs"] = self.ref_mutates
                self.check_inputs(trials, group)
            for t in group:
                self.phase(f"correctness trial {t}")
                _inputs, ref_out = trials[t]
                with self.step_seconds("candidate_trials_s"):
                    msg, fds = self.request({"op": "trial", "t": t}, "outputs")
                self.add_pack_seconds(msg)
                self.compare(ref_out, self.outputs(msg, fds, ref_out, f"trial {t}"), f"trial {t}")
                self.raise_flags(msg.get("flags"))
                if not layout.full:
                    del _inputs, ref_out, trials[t]
            if not layout.full:
                _memory.release(self.tools)

    # -- memory --------------------------------------------------------------------------------------
    def plan_memory(self, ref, init_inputs, first: tuple[list, list], n_trials: int):
        """Measure one forward (trial 0) and the device, choose the layout (``_memory.choose``), record
        it in ``details["memory_plan"]``; a task that does not fit even the smallest layout is a
        ``runtime_error`` saying so (before the candidate exists)."""
        tools, cfg = self.tools, self.cfg
        inputs, outs = first
        timing_trials = max(1, int(cfg.get("timing_trials", 100)))
        out_bytes = _memory.tensor_bytes(tools, outs)
        self.out_bytes = out_bytes
        sizes = _memory.Sizes(
            inputs=_memory.tensor_bytes(tools, inputs),
            outputs=out_bytes,
            peak=self.call_peak if self.call_peak is not None else out_bytes,
            model=_memory.model_bytes(tools, ref, init_inputs),
            compare=_memory.compare_bytes(tools, outs),
            flush=int(cfg.get("l2_flush_mb", 256)) * 2**20 if tools.is_cuda else 0,
            cuda=tools.is_cuda,
            block_outputs=max(out_bytes, min(RETAIN_BYTES, max(1, timing_trials // 8) * out_bytes)),
        )
        budget = _memory.measure_budget(
            tools, sizes.model + sizes.inputs + sizes.outputs, cfg.get("memory_budget_gb")
        )
        n_sets = input_sets(timing_trials, int(cfg.get("timing_input_sets", 3)))
        checked = min(CHECKED_CALLS, timing_trials)
        layout, budget = self.choose_layout(sizes, budget, (n_trials, n_sets, checked))
        need = _memory.needs(sizes, layout or _memory.smallest(), n_trials)
        measured = self.call_peak is not None
        self.details["memory_plan"] = _memory.describe(sizes, budget, layout, need, measured)
        if layout is None:
            raise Failure("runtime_error", _memory.too_large(sizes, budget, need), compiled=False)
        self.layout = layout
        # the candidate's process: what it may allocate on the device (``_memory.candidate_share``: the
        # rest of the budget alone, its model and headroom beside others), and how it holds its trials
        head = _memory.headroom(sizes)
        share = _memory.candidate_share(need, budget.pair, head, self.beside is not None)
        cap = share[0] if tools.is_cuda else None
        self.candidate_memory = {"lean": layout.lean, "full": layout.full, "cap_bytes": cap}
        self.details["memory_plan"].update(
            headroom_bytes=head, candidate_cap_bytes=cap, beside_others=self.beside is not None
        )
        return layout

    def choose_layout(self, sizes, budget, counts: tuple[int, int, int]):
        """``_memory.choose`` with ``counts`` (trials, timing input sets, checked calls); with a
        ``memory_ledger``, beside the reservations of the other evaluations on the device, and the
        chosen plan's bytes reserved. A task that fits the device alone but not beside them waits for
        room, up to ``LEDGER_WAIT`` of ``timeout_s``, then fails as the evaluator's error (the
        candidate is not at fault; nothing is recorded, and a resumed run evaluates it again).
        A task that does not fit the memory free now, while other evaluations in the ledger hold part of
        it, but fits the device alone waits the same way: its size is not its fault either.
        The layout leaves the candidate its model plus its headroom (``_memory.choose_leaving``): a
        share squeezed to what was left is where ``cuda_graph`` and ``channels_last`` candidates ran
        out of memory, and such a failure is only retried. Beside others that is a must (the task
        waits for room); alone, a task no such layout fits takes the largest layout that fits at all.
        Returns the layout (``None``: too large even alone) and the budget it was chosen in."""
        path, head = self.cfg.get("memory_ledger"), _memory.headroom(sizes)
        alone = _memory.choose_leaving(sizes, budget, head, counts, alone=True)
        if not path or (alone is None and not self.fits_without_the_others(sizes, budget, counts)):
            return alone, budget
        wait_s = LEDGER_WAIT * float(self.cfg.get("timeout_s", 300.0))
        give_up = time.monotonic() + wait_s
        previous, held = self.phase_name, sizes.model + sizes.inputs + sizes.outputs
        while True:
            with _ledger.Ledger(path) as book:
                others = book.count()
                shared = _memory.beside(budget, book.others(), others, held)
                layout = _memory.choose_leaving(sizes, shared, head, counts, alone=not others)
                if layout is not None:  # its model and the candidate's headroom (``candidate_share``)
                    need = _memory.needs(sizes, layout, counts[0])
                    book.reserve(_memory.candidate_share(need, shared.pair, head, True)[1])
            if layout is not None:
                if others:  # what the candidate's share would be with nothing else on the device
                    whole = _memory.alone(budget, self.cfg.get("memory_budget_gb"))
                    alone = _memory.choose_leaving(sizes, whole, head, counts, alone=True) or layout
                    self.beside = (others, whole.pair - _memory.needs(sizes, alone, counts[0])[0])
                if self.phase_name != previous:
                    self.phase(previous)
                return layout, shared
            if time.monotonic() > give_up:
                raise Failure(
                    "evaluator_error",
                    f"no room for this task beside the other evaluations on the device after waiting "
                    f"{wait_s:.0f} s: {shared.source}",
                    compiled=False,
                    cause=_memory.NO_ROOM,
                )
            if self.phase_name != "waiting for device memory":
                self.phase("waiting for device memory")
            time.sleep(LEDGER_POLL_S)
            budget = _memory.measure_budget(self.tools, held, self.cfg.get("memory_budget_gb"))

    def others_on_the_device(self) -> int:
        """How many other live evaluations the ``memory_ledger`` lists (0 without one)."""
        path = self.cfg.get("memory_ledger")
        if not path:
            return 0
        with _ledger.Ledger(path) as book:
            return book.count()

    def fits_without_the_others(self, sizes, budget, counts: tuple[int, int, int]) -> bool:
        """Whether the ledger lists other live evaluations and the task would fit the device without
        them (``_memory.alone``): what they hold now is why ``budget`` is too small."""
        if not self.others_on_the_device():
            return False
        whole = _memory.alone(budget, self.cfg.get("memory_budget_gb"))
        return _memory.choose(sizes, whole, *counts) is not None

    def note_candidate_peak(self, peak) -> None:
        """Record what the candidate's process reports it reserved on the device at most (CUDA), beside
        the plan's ``candidate_bytes`` and cap: the data to size ``_memory.headroom`` from. Reported by
        the candidate's own process, so a diagnostic, never part of a verdict."""
        if isinstance(peak, int) and not isinstance(peak, bool) and peak >= 0:
            self.details.setdefault("memory_plan", {})["candidate_peak_reserved_bytes"] = peak

    def out_of_memory(self, exc: BaseException) -> dict:
        """The result when an allocation failed in this process: before the build the task is too large
        for the device, unless other evaluations in the ledger hold memory (then it is the evaluator's
        error, and the recording evaluates the cell again, last alone); after it, something else (the
        candidate's process beyond its share, another process on the device) took memory the plan
        counted on."""
        plan = self.details.get("memory_plan", {})
        gib = _memory.gib
        planned = (
            f" (planned {gib(plan['reference_bytes'])} GiB here and {gib(plan['candidate_bytes'])} GiB for "
            f"the candidate's process of {gib(plan['budget_bytes'])} GiB)"
            if "reference_bytes" in plan
            else ""
        )
        others = self.others_on_the_device()
        if others:  # what the other evaluations hold may be all that is missing: nobody's fault here
            whose = "the task's or the candidate's" if self.built else "the task's"
            text = (
                f"the reference process ran out of memory beside {others} other evaluation"
                f"{'s' if others != 1 else ''} on the device (not {whose} fault; evaluated again) during "
                f"{self.phase_name}: {harness.describe(exc, 600)}"
            )
            return {
                "compiled": self.built,
                "correct": False,
                "error_kind": "evaluator_error",
                "error": text,
                "cause": _memory.REFERENCE_CROWDED_OUT,
            }
        if not self.built:
            text = "the task is too large for this device: the reference process ran out of memory during "
        else:
            text = "the reference process ran out of memory (the candidate's process or another process on "
            text += "the device used more than the plan left it) during "
        text += f"{self.phase_name}{planned}: {harness.describe(exc, 600)}"
        return {"compiled": self.built, "correct": False, "error_kind": "runtime_error", "error": text}

    def time_models(self, ref, get_inputs, warm: list | None, calibration: dict) -> Timing:
        """The timing phase, once more when a statistical check fails (it must fail twice: a loaded
        machine can fake one bad measurement, a tampered timer fails every time)."""
        for attempt in (0, 1):
            if attempt:
                self.phase("timing")
            if self.watch is not None:
                killed = self.watch.quiet_window()
                self.details["children_killed"] = self.details.get("children_killed", 0) + killed
            timing = None  # the first attempt's sets go before the second's are made
            timing = Timing(self, ref, get_inputs, warm, calibration, set_base=1000 * attempt)
            with SharedCores(self.watch, self.timing_cores(), self.cfg.get("core_claims")) as cores:
                timing.run()
            self.details["timing_cpus"] = cores.cpus
            if cores.shared:  # every core was being timed on by another evaluation of the host
                self.details["timing_cpus_shared"] = cores.shared
            self.phase("checking the timed calls")
            timing.verify()
            try:
                timing.check_statistics()
                return timing
            except Failure as failure:
                if attempt:
                    raise
                self.details["timed_twice"] = failure.message
        raise AssertionError("unreachable")

    def timing_cores(self) -> int:
        """``EvalConfig.timing_cores``, 0 resolved: one core on CUDA, the intra-op threads' on CPU."""
        cores = int(self.cfg.get("timing_cores") or 0)
        if cores > 0:
            return cores
        return 1 if self.tools.is_cuda else self.torch.get_num_threads()

    def calibrate(self, ref, inputs: list) -> dict:
        """Time the reference in blocks as in the timing phase, each followed by a round trip to the
        candidate process (not yet running candidate code, so it answers at once): the link's latency
        when the other process has been waiting as long as it will while the reference is timed."""
        tools = self.tools
        first = [tools.timed(ref, inputs[i % len(inputs)])[1] for i in range(CLEAN_CALLS)][2:]
        per_block = max(1, round(0.25 * BLOCK_MS / max(harness.median_iqr(first)[0], 1e-6)))
        clean, rtts = [], []
        for k in range(CALIBRATION_BLOCKS):
            for i in range(per_block):
                clean.append(tools.timed(ref, inputs[(k + i) % len(inputs)])[1])
            t0 = time.perf_counter()
            self.request({"op": "ping"}, "pong")
            rtts.append(time.perf_counter() - t0)
        rtt, _ = harness.median_iqr(rtts)
        clean_ms, _ = harness.median_iqr(clean)
        return {"clean_ms": clean_ms, "rtt": rtt, "rtt_spread": percentile(rtts, SPREAD_PERCENTILE) - rtt}

    def raise_flags(self, flags) -> None:
        if flags:
            raise Failure(
                "suspicious", str(flags[0])[:2000] if isinstance(flags, list) else "malformed flags"
            )

    # -- comparison (``_compare.py``) -------------------------------------------------------------------
    def check_structure(self, reference: list, metas: list, what: str) -> None:
        self.comparer.check_structure(reference, metas, what)

    def compare(self, reference: list, new: list, what: str) -> None:
        with self.step_seconds("compare_s"):
            self.comparer.compare(reference, new, what)


def input_module_source(task_source: str) -> str:
    """The task source with its top-level ``class Model`` replaced by ``Model = _autoprofiler_stand_in``
    (line numbers kept): what the candidate's process runs to build inputs."""
    tree = ast.parse(task_source)
    lines = task_source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            end = node.end_lineno
            lines[start:end] = ["Model = _autoprofiler_stand_in"] + [""] * (end - start - 1)
    return "\n".join(lines) + "\n"


def percentile(xs: list[float], p: float) -> float:
    """Linear-interpolation percentile, ``p`` in [0, 100]; 0.0 for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90)
    4.6
    """
    if not xs:
        return 0.0
    xs = sorted(xs)
    pos = (len(xs) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def detach_all(tools: harness.Tools, obj) -> list:
    return [tools.clone(tools.detach(t)) if isinstance(t, tools.Tensor) else t for t in tools.flatten(obj)]


def detach_lean(tools: harness.Tools, obj, inputs: list, model) -> list:
    """``detach_all`` without its copies, where none is needed: an output is copied only when it shares
    memory with the inputs or the model's parameters and buffers (a later call could change it there)
    or is a view of a larger block (which it would keep alive)."""
    held = [t for t in tools.flatten(inputs) if isinstance(t, tools.Tensor)]
    if isinstance(model, tools.torch.nn.Module):
        held += [*model.parameters(), *model.buffers()]
    owned = {_storage(t)[0] for t in held}
    out = []
    for t in tools.flatten(obj):
        if isinstance(t, tools.Tensor):
            t = tools.detach(t)
            ptr, nbytes = _storage(t)
            if ptr is None or ptr in owned or nbytes > t.numel() * t.element_size():
                t = tools.clone(t)
        out.append(t)
    return out


def _storage(t) -> tuple[int | None, int]:
    """The data pointer and size of ``t``'s storage; ``(None, 0)`` where it has none (sparse, ...)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None, 0
