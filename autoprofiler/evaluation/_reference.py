"""The reference process of an evaluation: the reference model, its outputs, the clock and the verdict.

Loaded by ``_harness.py`` (by path) in the reference worker, which never runs candidate code. Steps
(each announced to the parent as a phase):

1. load the task, construct ``Model`` (seeded), send the candidate process the task's input functions
   (``input_source``: ``Model`` replaced by a stand-in) and the seed;
2. run the reference on the correctness inputs (``seed + t``); check that the candidate process built
   the very same inputs (checksums); measure the link's round trip (the candidate is not imported yet,
   so this is the harness's own latency) and a clean reference time;
3. ``build``: the candidate process imports the candidate and constructs ``ModelNew``;
4. correctness: each trial's outputs come back in a sealed memfd and are compared here (shape, dtype,
   NaN/Inf, ``allclose``, relative error norm); then the candidate process's own flags;
5. timing, under the optional ``timing_lock`` (held by this process only): a quiet window in which the
   candidate process and its children must use no CPU (busy ones are ``suspicious``, idle children are
   killed); warm-up; then ``timing_trials`` calls of each model in alternating blocks. The calls run on
   ``timing_input_sets`` input sets made on first use from secret seeds, in a secret random order, each
   set's first use in a block of its own. The candidate's calls are timed in its process (CUDA events /
   ``perf_counter``) and *witnessed* here: the wall time of each of its blocks, less the link's round
   trip and this process's own untimed work for the same calls, must agree with the times it reports;
   its process must use no CPU while the reference is timed; no child process may be alive at the end;
6. after the fact: the outputs of three timed calls chosen in secret (the last one among them) must
   match what the candidate committed to (checksums sent with each block) and the reference outputs;
   the first use of an input set must not take much longer than later uses (memoization).

Reported times are medians over blocks of the per-call mean within each block, so a candidate cannot
lower its median by moving time between the calls of one witnessed block.
"""

from __future__ import annotations

import ast
import math
import os
import random
import time

import _autoprofiler_harness as harness
from _autoprofiler_harness import Failure

_watch = harness.role_module("watch")
ProcessWatch, SharedCores, TimingLock = _watch.ProcessWatch, _watch.SharedCores, _watch.TimingLock

TASK_MODULE = "_autoprofiler_reference_task"
# Kinds a candidate process may report about itself (anything else it sends is a runtime_error).
CANDIDATE_KINDS = ("compile_error", "runtime_error", "crashed", "suspicious")
BUILD_PHASES = ("loading the candidate", "constructing ModelNew")

CLEAN_CALLS = 5  # reference calls timed before the candidate exists (the first two are warm-up)
CALIBRATION_BLOCKS = 4  # reference blocks, each followed by a round trip on the link, before the build
BLOCK_MS = 4.0  # target reference time of one timing block
RETAIN_BYTES = 256 * 2**20  # outputs of one block each process keeps until the after-the-fact choice
CHECKED_CALLS = 3  # timed calls whose outputs are compared after the fact (the last one among them)
WINDOW_BUSY_S = 0.005  # CPU the candidate's process may use while the reference is timed ...
WINDOW_BUSY_SHARE = 0.10  # ... plus this share of the reference's timed windows
WITNESS_SHARE = 0.3  # the clock here may see this much more than the candidate reports, per block ...
WITNESS_SLACK_MS = 0.5  # ... plus this, plus twice the spread of the link's round trip (per block)
SPREAD_TOLERANCE = 0.25  # block means / median call: the candidate's may exceed the reference's by this
MIN_BLOCKS = 3  # a statistical check needs at least this many blocks of each kind it compares
MEMO_RATIO = 1.5  # first use of an input set / later uses, beyond the reference's own ratio ...
MEMO_SLACK_MS = 0.05  # ... plus this


def serve(job: dict, tools: harness.Tools, channel: harness.Channel, link: harness.Link) -> None:
    """Evaluate, then write the result line (with the job's nonce) on the result channel."""
    referee = Referee(job, tools, channel, link)
    with tools.no_grad():
        try:
            result = referee.run()
        except Failure as f:
            result = {"compiled": f.compiled, "correct": False, "error_kind": f.kind, "error": f.message}
            if f.kind == "crashed" and getattr(f, "candidate_died", False):
                result["candidate_died"] = True
        except BaseException as exc:
            result = {
                "compiled": referee.built,
                "correct": False,
                "error_kind": "evaluator_error",
                "error": f"the reference process failed during {referee.phase_name}: {harness.describe(exc)}",
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
                )
                failure.candidate_died = True
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
        return Failure(kind, text, compiled=self.built or kind == "suspicious")

    def protocol_error(self, what: str) -> Failure:
        return Failure("suspicious", f"the candidate's process broke the evaluation protocol: {what}")

    def outputs(self, msg: dict, fds: list[int], reference: list, what: str) -> list:
        """The candidate's outputs from a memfd, after checking their structure against ``reference``."""
        if len(fds) != 1 or not isinstance(msg.get("meta"), list):
            harness.close_fds(fds)
            raise self.protocol_error("outputs without exactly one memfd")
        try:
            self.check_structure(reference, msg["meta"], what)
        except BaseException:
            harness.close_fds(fds)
            raise
        try:
            return harness.unpack_tensors(self.tools, msg["meta"], fds[0])  # closes the memfd
        except harness.ProtocolError as exc:
            raise self.protocol_error(str(exc)) from exc

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
            raise Failure(
                "task_error", "the task failed to load: " + harness.describe(exc), compiled=False
            ) from exc
        self.link.send({"op": "setup", "input_source": input_source, "seed": seed, "trials": n_trials})

        self.phase("running the reference")
        trials, ref_mutates = [], False
        try:
            for t in range(n_trials):
                inputs = tools.make_inputs(get_inputs, seed + t)
                mine = tools.clone_all(inputs)
                out = ref(*mine)
                tools.sync()
                ref_mutates |= not tools.same_inputs(inputs, mine)
                trials.append((inputs, detach_all(tools, out)))
        except Exception as exc:
            raise Failure(
                "task_error", "the reference failed: " + harness.describe(exc), compiled=False
            ) from exc
        self.details["ref_mutates_inputs"] = ref_mutates
        msg, _ = self.receive("inputs")
        if msg.get("init") != tools.checksum(init_inputs) or msg.get("trials") != [
            tools.checksum(inputs) for inputs, _ in trials
        ]:
            raise Failure(
                "task_error",
                "get_inputs()/get_init_inputs() give different values in two processes under the same "
                "seed (they must be reproducible from torch.manual_seed, random.seed or numpy's seed)",
                compiled=False,
            )
        tools.prepare_timing(int(cfg.get("l2_flush_mb", 256)))
        t0 = time.perf_counter()
        calibration = self.calibrate(ref, [inputs for inputs, _ in trials])
        self.details["calibration_s"] = round(time.perf_counter() - t0, 4)

        self.link.send({"op": "build", "ref_mutates": ref_mutates})
        self.phase("loading the candidate")
        self.receive("built")
        self.built = True

        for t, (_inputs, ref_out) in enumerate(trials):
            self.phase(f"correctness trial {t}")
            msg, fds = self.request({"op": "trial", "t": t}, "outputs")
            self.compare(ref_out, self.outputs(msg, fds, ref_out, f"trial {t}"), f"trial {t}")
            self.raise_flags(msg.get("flags"))
        msg, _ = self.request({"op": "checks"}, "checks")
        self.raise_flags(msg.get("flags"))

        self.phase("timing")
        lock = TimingLock(cfg.get("timing_lock"))
        try:  # the evaluator's fault, not the candidate's: reported apart, never a candidate's error
            lock.acquire()
        except OSError as exc:
            raise Failure("evaluator_error", f"timing lock: {harness.describe(exc)}") from exc
        with lock:
            timing = self.time_models(ref, get_inputs, trials, calibration)
        msg, _ = self.request({"op": "finish"}, "report")
        self.raise_flags(msg.get("flags"))
        self.phase("done")
        return timing.result(n_trials)

    def time_models(self, ref, get_inputs, trials: list, calibration: dict) -> Timing:
        """The timing phase, once more when a statistical check fails (it must fail twice: a loaded
        machine can fake one bad measurement, a tampered timer fails every time)."""
        for attempt in (0, 1):
            if attempt:
                self.phase("timing")
            if self.watch is not None:
                killed = self.watch.quiet_window()
                self.details["children_killed"] = self.details.get("children_killed", 0) + killed
            timing = Timing(self, ref, get_inputs, trials, calibration, set_base=1000 * attempt)
            with SharedCores(self.watch, self.torch.get_num_threads()) as cores:
                timing.run()
            self.details["timing_cpus"] = cores.cpus
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
        return {"clean_ms": clean_ms, "rtt": rtt, "rtt_spread": percentile(rtts, 90) - rtt}

    def raise_flags(self, flags) -> None:
        if flags:
            raise Failure(
                "suspicious", str(flags[0])[:2000] if isinstance(flags, list) else "malformed flags"
            )

    # -- comparison ----------------------------------------------------------------------------------
    def check_structure(self, reference: list, metas: list, what: str) -> None:
        """Count, shapes, dtypes and devices from the metadata alone (before any data is read)."""
        if len(metas) != len(reference):
            raise Failure("wrong_shape", f"{what}: {len(metas)} outputs, expected {len(reference)}")
        for i, (r, meta) in enumerate(zip(reference, metas, strict=True)):
            name = f"{what}: output {i}" if len(reference) > 1 else what
            if not isinstance(r, self.tools.Tensor):
                continue
            if not isinstance(meta, dict) or meta.get("kind") != "tensor":
                kind = meta.get("type") if isinstance(meta, dict) else None
                got = kind or type(meta.get("value") if isinstance(meta, dict) else meta).__name__
                raise Failure(
                    "wrong_shape", f"{name}: got {got}, expected a tensor of shape {tuple(r.shape)}"
                )
            shape = tuple(meta.get("shape") or ())
            if shape != tuple(r.shape):
                raise Failure("wrong_shape", f"{name}: shape {shape}, expected {tuple(r.shape)}")
            if f"torch.{meta.get('dtype')}" != str(r.dtype):
                raise Failure("wrong_output", f"{name}: dtype torch.{meta.get('dtype')}, expected {r.dtype}")
            if meta.get("device") != r.device.type:
                raise Failure("wrong_output", f"{name}: on device {meta.get('device')}, expected {r.device}")

    def compare(self, reference: list, new: list, what: str) -> None:
        """Raise ``Failure`` when the candidate's outputs do not match the reference's."""
        tools = self.tools
        if len(new) != len(reference):
            raise Failure("wrong_shape", f"{what}: {len(new)} outputs, expected {len(reference)}")
        for i, (r, n) in enumerate(zip(reference, new, strict=True)):
            name = f"{what}: output {i}" if len(reference) > 1 else what
            if isinstance(r, tools.Tensor):
                self.compare_tensor(r, n, name)
            elif isinstance(r, float) and isinstance(n, (int, float)):
                if not math.isclose(r, n, rel_tol=1e-4, abs_tol=1e-4):
                    raise Failure("wrong_output", f"{name}: {n!r}, expected {r!r}")
            elif r != n and repr(r) != repr(n):
                raise Failure("wrong_output", f"{name}: {n!r}, expected {r!r}")

    def quick_match(self, r, n, atol: float, rel_tol: float) -> bool:
        """True when ``n`` certainly passes ``compare_tensor``, found in a few passes: everything finite
        (a finite sum), max ``|n - r|`` within ``atol`` (so within ``allclose``'s tolerance) and the
        relative error norm within ``rel_tol``. Anything else takes the full check and its message."""
        torch = self.torch
        if r.numel() == 0:
            return False
        wide = torch.float64 if r.dtype == torch.float64 else torch.float32
        rw, nw = r.to(wide), n.to(wide)
        if not (math.isfinite(float(rw.sum())) and math.isfinite(float(nw.sum()))):
            return False
        diff = (nw - rw).abs_()
        if float(diff.amax()) > atol:
            return False
        ref_norm = float(torch.linalg.vector_norm(rw))
        return ref_norm == 0.0 or float(torch.linalg.vector_norm(diff)) / ref_norm <= rel_tol

    def compare_tensor(self, r, n, name: str) -> None:
        torch = self.torch
        if not r.is_floating_point() and not r.is_complex():
            if not torch.equal(n, r):
                raise Failure("wrong_output", f"{name}: integer/bool values differ from the reference")
            return
        atol, rtol, rel_tol = tolerances(torch, r.dtype, self.cfg)
        if r.is_floating_point() and self.quick_match(r, n, atol, rel_tol):
            return
        rd, nd = r.to(torch.float64), n.to(torch.float64)
        r_fin, n_fin = torch.isfinite(rd), torch.isfinite(nd)
        bad = r_fin & ~n_fin
        if bool(bad.any()):
            raise Failure(
                "wrong_output", f"{name}: {int(bad.sum())} NaN/Inf values where the reference is finite"
            )
        if not bool(torch.allclose(nd, rd, rtol=rtol, atol=atol, equal_nan=True)):
            both = r_fin & n_fin
            diff = torch.where(both, (nd - rd).abs(), torch.zeros_like(rd))
            k = int(torch.argmax(diff.reshape(-1)))
            worst, got, want = (float(t.reshape(-1)[k]) for t in (diff, nd, rd))
            raise Failure(
                "wrong_output",
                f"{name}: not allclose (atol={atol:g}, rtol={rtol:g}): max abs diff {worst:.3g}"
                f" at flat index {k} (got {got:.6g}, expected {want:.6g})",
            )
        both = r_fin & n_fin
        ref_norm = float(torch.linalg.vector_norm(rd[both]))
        if ref_norm > 0.0:
            err = float(torch.linalg.vector_norm(nd[both] - rd[both])) / ref_norm
            if err > rel_tol:
                raise Failure(
                    "wrong_output",
                    f"{name}: relative error norm |out-ref|/|ref| = {err:.3g} > {rel_tol:g} although "
                    f"allclose passed (outputs near zero, |ref| = {ref_norm:.3g}: KernelBench issue 165)",
                )


class Timing:
    """The timing phase: warm-up, the schedule of blocks, the witness, the checks after the fact."""

    def __init__(self, referee: Referee, ref, get_inputs, trials: list, calibration: dict, set_base: int = 0):
        self.referee = referee
        self.get_inputs = get_inputs
        self.set_base = set_base
        self.tools = referee.tools
        self.cfg = referee.cfg
        self.ref = ref
        self.trials = trials
        self.clean_ms = clean_ms = calibration["clean_ms"]
        self.rtt = calibration["rtt"]
        self.rtt_spread = calibration["rtt_spread"]
        self.trials_n = max(1, int(self.cfg.get("timing_trials", 100)))
        out_bytes = sum(
            t.numel() * t.element_size() for t in trials[0][1] if isinstance(t, self.tools.Tensor)
        )
        block = round(BLOCK_MS / max(clean_ms, 1e-6))
        self.block_size = max(1, min(block, self.trials_n // 8, RETAIN_BYTES // max(1, out_bytes)))
        self.blocks = schedule(
            self.trials_n, int(self.cfg.get("timing_input_sets", 4)), self.block_size, self.referee.rng
        )
        last = self.trials_n - 1
        others = self.referee.rng.sample(range(last), min(CHECKED_CALLS - 1, last))
        self.checked = sorted({last, *others})
        self.seeds = {}
        self.sets: dict[int, list] = {}
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
        referee.request({"op": "warmup", "calls": warmup}, "warm")
        tools.prepare_timing(int(self.cfg.get("l2_flush_mb", 256)))
        held = None
        for i in range(warmup):
            held = self.ref(*self.trials[i % len(self.trials)][0])
        tools.sync()
        del held
        # What the timer adds to every measurement (event record + device sync + event record): the
        # same for both models, so it biases speedups toward 1.0 for the tiniest kernels; reported.
        overhead = [tools.timed(lambda: None, ())[1] for _ in range(10)] if tools.is_cuda else [0.0]
        self.timer_overhead_ms = harness.median_iqr(overhead)[0]

        watch = referee.watch
        busy, window = 0.0, 0.0
        keep_new: list[bool] = []
        held_ref: list = []
        t_start = time.perf_counter()
        for k, block in enumerate(self.blocks):
            row = {"calls": [c for c, _, _ in block], "first": block[0][2]}
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
                    t0 = time.perf_counter()
                    try:
                        referee.link.send({"op": "block", "calls": calls, "keep": keep_new}, tuple(fds))
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
        self.keep_last = keep_new
        self.busy, self.window = busy, window

    def share_set(self, index: int) -> None:
        """Make input set ``index`` into a sealed memfd that both processes map (CPU), before either
        uses it: both models then read the very same memory, as they would in one process."""
        inputs = self.tools.make_inputs(self.get_inputs, self.seed_of(index))
        if any(isinstance(x, (list, tuple, dict)) for x in inputs):
            self.share_sets = False  # nested inputs: each process makes its own from the seed
            return
        metas, fd = harness.pack_tensors(self.tools, inputs)
        self.shared[index] = (metas, fd)
        self.mine[index] = (metas, os.dup(fd))

    def make_set(self, index: int, seed: int) -> list:
        """Input set ``index`` at its first use: mapped when shared (the candidate's process maps it in
        its block the same way), else made from its seed."""
        if index in self.mine:
            metas, fd = self.mine.pop(index)
            return harness.unpack_tensors(self.tools, metas, fd, copy=False)
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
        if not referee.details.get("ref_mutates_inputs"):  # checked first: scribbled inputs change outputs
            sets = {str(self.set_base + i): tools.checksum(inputs) for i, inputs in self.sets.items()}
            if msg.get("sets") != sets:
                harness.close_fds(fds)
                raise Failure("suspicious", "the candidate modified its inputs while timed")
        kept = self.kept_outputs(msg, fds)
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
        }

    def kept_outputs(self, msg: dict, fds: list[int]) -> dict[int, list]:
        referee = self.referee
        calls, counts = msg.get("calls"), msg.get("counts")
        if calls != self.checked or not isinstance(counts, list) or len(counts) != len(calls):
            harness.close_fds(fds)
            raise referee.protocol_error("kept outputs for other calls than asked")
        reference = [r for call in calls for r in self.ref_kept[call]]
        if sum(counts) != len(reference) or counts != [len(self.ref_kept[c]) for c in calls]:
            harness.close_fds(fds)
            raise Failure(
                "wrong_shape",
                f"timed calls: {counts} outputs, expected {[len(self.ref_kept[c]) for c in calls]}",
            )
        values = referee.outputs(msg, fds, reference, "timed calls")
        kept, i = {}, 0
        for call, n in zip(calls, counts, strict=True):
            kept[call] = values[i : i + n]
            i += n
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
        over its per-call median must not exceed the reference's same ratio by more than the tolerance."""
        if self.block_size == 1 or len(self.rows) < MIN_BLOCKS or not ref_med or not new_med:
            return
        ref_means, _ = harness.median_iqr([sum(r["ref"]) / len(r["ref"]) for r in self.rows])
        new_means, _ = harness.median_iqr([sum(r["new"]) / len(r["new"]) for r in self.rows])
        ref_ratio, new_ratio = ref_means / ref_med, new_means / new_med
        self.referee.details["spread"] = {"ref": round(ref_ratio, 4), "new": round(new_ratio, 4)}
        if new_ratio > ref_ratio * (1 + SPREAD_TOLERANCE):
            raise Failure(
                "suspicious",
                f"the candidate's per-call times do not add up like the reference's: its block means are "
                f"{new_ratio:.2f}x its median call, the reference's {ref_ratio:.2f}x (it reports a few long "
                "calls and many short ones)",
            )

    def check_memoization(self) -> None:
        """First uses of an input set must not take much longer than later uses (beyond the reference's
        own ratio): a candidate that caches outputs by input is fast only on inputs it has seen. The
        times compared are the candidate's own, each first use alone in a witnessed block."""
        first = [r for r in self.rows if r["first"]]
        later = [r for r in self.rows if not r["first"]]
        if len(first) < MIN_BLOCKS or len(later) < MIN_BLOCKS:
            return
        # the fastest first use: a cache makes every first use slow, a loaded machine only some
        new_first = min(r["new"][0] for r in first)
        new_later, _ = harness.median_iqr([sum(r["new"]) / len(r["new"]) for r in later])
        ref_first = min(r["ref"][0] for r in first)
        ref_later, _ = harness.median_iqr([sum(r["ref"]) / len(r["ref"]) for r in later])
        ref_ratio = ref_first / ref_later if ref_later > 0 else 1.0
        self.referee.details["memo"] = {  # kept in the result whatever the verdict
            "new_first_ms": round(new_first, 4),
            "new_later_ms": round(new_later, 4),
            "ref_first_ms": round(ref_first, 4),
            "ref_later_ms": round(ref_later, 4),
        }
        if new_first > MEMO_RATIO * max(1.0, ref_ratio) * new_later + MEMO_SLACK_MS:
            raise Failure(
                "suspicious",
                f"timed calls on an input set it had seen before took {new_later:.4g} ms, the first call on "
                f"each set at least {new_first:.4g} ms (reference: {ref_later:.4g} / {ref_first:.4g} ms): it "
                "reuses outputs across calls (memoization)",
            )


def schedule(trials: int, sets: int, block_size: int, rng) -> list[list[tuple[int, int, bool]]]:
    """Blocks of ``(call index, input set, first use)``: each set's first use at a random position, in a
    block of its own; the other calls draw a random set already in use, in blocks of ``block_size``.

    >>> blocks = schedule(12, 3, 4, random.Random(0))
    >>> [c for block in blocks for c, _, _ in block] == list(range(12))
    True
    >>> sum(first for block in blocks for _, _, first in block)
    3
    """
    n_sets = max(1, min(sets, trials // 4))  # most calls reuse a set: first uses stand out
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
        current.append((call, rng.randrange(introduced), False))
        if len(current) == block_size:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


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


def tolerances(torch, dtype, config: dict) -> tuple[float, float, float]:
    low = dtype in (torch.float16, torch.bfloat16)
    default = 1e-2 if low else 1e-4
    atol = config.get("atol")
    rtol = config.get("rtol")
    atol = default if atol is None else float(atol)
    rtol = default if rtol is None else float(rtol)
    rel = config.get("rel_norm_tol")
    rel = 10.0 * max(atol, rtol) if rel is None else float(rel)
    return atol, rtol, rel
