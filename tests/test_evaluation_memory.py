"""The evaluator's memory plan on CPU (``autoprofiler/evaluation/_memory.py``, ``docs/evaluator.md``).

A task whose inputs are large next to the memory budget (``EvalConfig.memory_budget_gb``, or the
workers' ``RLIMIT_AS``) is evaluated holding one correctness trial and fewer timing input sets at a time,
still correctly, and a memoizing candidate is still caught; a task too large even so is a
``runtime_error`` that says so; a small task keeps the default plan. The comparison of large outputs in
chunks gives the same verdicts and messages as the whole-tensor comparison.

Run: ``python -m pytest tests/test_evaluation_memory.py -q`` (about 30 s on 2 CPUs).
"""

from __future__ import annotations

import doctest
import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import load_tiny_task
from memory_tasks import projection_task, row_sum_task

from autoprofiler.evaluation import EvalConfig, Evaluator, identity_candidate
from autoprofiler.evaluation._harness import Failure, Tools, role_module

memory = role_module("memory")
BASE = EvalConfig(device="cpu", task_size="small", timing_trials=20, warmup=3, timeout_s=120.0)
MiB = 2**20

# A projection of a 32 MiB input: the default plan holds ~0.55 GiB in the two processes, the smallest
# ~0.1 GiB; with 0.15 GiB only one timing input set can be alive at once (two need >= 0.17 GiB). The
# measured peak (a few MiB on CPU, noisy) can only raise the needs, so it never makes two sets fit, and it
# would take a peak above ~20 MiB to make even the smallest plan miss the budget.
PROJECTION = projection_task(32 * MiB)
TIGHT = replace(BASE, memory_budget_gb=0.15)

MEMOIZE_PROJECTION = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, cols, out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cols, out) / cols**0.5)
        self.cache = {}

    def forward(self, x):
        key = (tuple(x.shape), tuple(x.reshape(-1)[::65537].tolist()))  # a few sampled values
        if key not in self.cache:
            self.cache[key] = x @ self.weight
        return self.cache[key].clone()
"""


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(BASE, spares=1) as ev:
        yield ev


def plan_of(result) -> dict:
    return result.details["memory_plan"]


# --- the plan itself --------------------------------------------------------------------------------
def test_memory_modules_doctests():
    """The worked examples in the docstrings of the plan, the schedule and the task builders hold."""
    import memory_tasks

    for module in (memory, role_module("timing"), role_module("ledger"), memory_tasks):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_choose_keeps_the_default_when_it_fits_and_shrinks_in_order():
    """The default layout whenever it fits; smaller budgets first give up trials held at once, copies
    around calls and live sets, the checked outputs last; each chosen layout fits; per-process limits
    count; below the smallest layout, nothing."""
    sizes = memory.Sizes(
        inputs=64 * MiB,
        outputs=64 * MiB,
        peak=64 * MiB,
        model=MiB,
        compare=64 * MiB,
        flush=0,
        cuda=True,
        block_outputs=64 * MiB,
    )
    default = memory.Layout(5, False, 3, 3, True)
    full_need = sum(memory.needs(sizes, default, 5))
    assert memory.choose(sizes, memory.Budget(full_need, None, 0, ""), 5, 3, 3) == default
    smallest_need = memory.needs(sizes, memory.smallest(), 5)
    assert memory.choose(sizes, memory.Budget(sum(smallest_need) - 1, None, 0, ""), 5, 3, 3) is None
    previous = None
    for budget in range(full_need - 1, sum(smallest_need) - 1, -16 * MiB):
        layout = memory.choose(sizes, memory.Budget(budget, None, 0, ""), 5, 3, 3)
        assert layout is not None and not layout.full
        assert sum(memory.needs(sizes, layout, 5)) <= budget
        key = (layout.checked_calls, layout.live_sets, not layout.lean, layout.trials_held)
        assert previous is None or key <= previous  # never closer to the default with less memory
        previous = key
    assert previous[:2] == (1, 1)  # one checked call, one live set near the smallest budget
    assert memory.choose(sizes, memory.Budget(sum(smallest_need), None, 0, ""), 5, 3, 3) is not None
    alone = memory.Budget(10 * full_need, max(smallest_need), 0, "")  # the pair fits, each process not
    layout = memory.choose(sizes, alone, 5, 3, 3)
    assert layout is not None and not layout.full
    assert max(memory.needs(sizes, layout, 5)) <= max(smallest_need)


def test_chunked_comparison_gives_the_same_verdicts(monkeypatch):
    """Outputs above the chunk size are compared chunk by chunk: the same kinds and messages as the
    whole-tensor comparison, for matches, NaNs, values off, near-zero outputs and integers."""
    import torch

    compare = role_module("compare")
    comparer = compare.Comparer(Tools(torch, "cpu"), {})
    torch.manual_seed(0)
    ref = torch.randn(1000)
    cases = {
        "same": ref.clone(),
        "close": ref + 1e-6,
        "nan": torch.where(torch.arange(1000) == 777, torch.tensor(float("nan")), ref),
        "off": torch.where(torch.arange(1000) == 333, ref + 0.5, ref),
        "spread": ref + 0.01 * torch.linspace(0, 1, 1000),
    }
    tiny = torch.full((1000,), 1e-6)
    ints = torch.arange(1000)

    def verdict(r, n):
        try:
            comparer.compare([r], [n], "trial 0")
        except Failure as f:
            return f.kind, f.message
        return None

    whole = {name: verdict(ref, n) for name, n in cases.items()}
    whole["near_zero"] = verdict(tiny, torch.zeros(1000))
    whole["ints"] = verdict(ints, ints.flip(0))
    monkeypatch.setattr(compare, "COMPARE_CHUNK", 64)
    chunked = {name: verdict(ref, n) for name, n in cases.items()}
    chunked["near_zero"] = verdict(tiny, torch.zeros(1000))
    chunked["ints"] = verdict(ints, ints.flip(0))
    assert whole["same"] is None and whole["close"] is None
    assert {k: v and v[0] for k, v in whole.items()} == {
        "same": None,
        "close": None,
        "nan": "wrong_output",
        "off": "wrong_output",
        "spread": "wrong_output",
        "near_zero": "wrong_output",
        "ints": "wrong_output",
    }
    assert chunked == whole


def test_not_close_names_the_value_outside_the_tolerance(monkeypatch):
    """The message names the worst value outside ``allclose``'s tolerance, and how many are, not the
    largest difference: 10,000.5 against 10,000 is within rtol=1e-4, 0.01 against 0.001 is not. Whole
    and chunked comparisons agree."""
    import torch

    compare = role_module("compare")
    comparer = compare.Comparer(Tools(torch, "cpu"), {})
    ref = torch.tensor([10000.0, 0.001, 1.0, 2.0] * 50)
    new = ref.clone()
    new[0], new[5], new[9] = 10000.5, 0.01, 0.0015
    messages = []
    for chunk in (None, 8):
        if chunk:
            monkeypatch.setattr(compare, "COMPARE_CHUNK", chunk)
        with pytest.raises(Failure) as failed:
            comparer.compare([ref], [new], "trial 0")
        messages.append(failed.value.message)
    assert messages[0] == messages[1]
    assert (
        "2 of 200 values outside the tolerance, the worst at flat index 5 (got 0.01, expected 0.001"
        in messages[0]
    )


# --- evaluations ------------------------------------------------------------------------------------
def test_small_task_keeps_the_default_plan(evaluator):
    """A tiny task: the default layout (every trial held, three timing sets alive, three checked calls),
    as before the plan existed."""
    task = load_tiny_task("matmul")
    result = evaluator.evaluate(task, identity_candidate(task.source))
    assert result.correct, result.summary()
    plan = plan_of(result)
    assert plan["default"] and plan["trials_held"] == 5 and plan["live_sets"] == 3
    assert plan["checked_calls"] == 3 and not plan["lean"]
    assert result.details["timing_input_sets"] == 3
    # what the candidate's share was made of; no device cap or device peak on the CPU
    assert plan["headroom_bytes"] == plan["input_bytes"] + plan["peak_bytes"] > 0, plan
    assert plan["candidate_cap_bytes"] is None and plan["beside_others"] is False, plan
    assert "candidate_peak_reserved_bytes" not in plan, plan


def test_large_inputs_use_one_live_set_and_stay_correct(evaluator):
    """With a budget that does not hold the default plan: one trial and one timing input set at a time
    (three checked calls: the outputs are small); the identity candidate is still correct, the three
    sets still each have their first use (the memoization check ran), and the plan is recorded."""
    default = evaluator.evaluate(PROJECTION, identity_candidate(PROJECTION.source))
    assert default.correct and plan_of(default)["default"], default.summary()
    assert sum((plan_of(default)["reference_bytes"], plan_of(default)["candidate_bytes"])) > 0.15 * 2**30
    result = evaluator.evaluate(PROJECTION, identity_candidate(PROJECTION.source), config=TIGHT)
    assert result.correct, result.summary()
    plan = plan_of(result)
    assert not plan["default"], plan
    assert plan["live_sets"] == 1 and plan["trials_held"] == 1 and plan["checked_calls"] == 3, plan
    assert plan["reference_bytes"] + plan["candidate_bytes"] <= plan["budget_bytes"] == int(0.15 * 2**30)
    assert plan["input_bytes"] == 32 * MiB
    assert result.details["timing_input_sets"] == 3 and result.details["correctness_trials"] == 5
    assert "new_first_ms" in result.details["memo"], result.details["memo"]


def test_memoization_is_caught_with_one_live_set(evaluator):
    """Rolling sets keep the memoization check: a candidate answering from a cache keyed by a sample of
    its input's values is slow on each set's first use and fast after, with one set alive at a time as
    with three."""
    result = evaluator.evaluate(PROJECTION, MEMOIZE_PROJECTION, config=TIGHT)
    assert plan_of(result)["live_sets"] == 1
    assert result.error_kind == "suspicious" and "memoization" in result.error, result.summary()


def test_too_large_for_the_budget_is_a_clear_error(evaluator):
    """Below the smallest plan: a runtime_error naming what is needed and what is available, before any
    candidate code runs (not a TaskError, not an out-of-memory traceback); the Evaluator goes on."""
    task = row_sum_task(64 * MiB)
    result = evaluator.evaluate(
        task, identity_candidate(task.source), config=replace(BASE, memory_budget_gb=0.05)
    )
    assert result.error_kind == "runtime_error" and not result.compiled, result.summary()
    assert "too large for this device" in result.error and "0.05 GiB available" in result.error
    assert "Traceback" not in result.error
    check = load_tiny_task("matmul")
    assert evaluator.evaluate(check, identity_candidate(check.source)).correct


def test_rlimit_as_shapes_the_plan_and_an_input_beyond_it_is_too_large():
    """With RLIMIT_AS = 2 GiB per worker (memory_limit_gb) and no injected budget: a row sum over a
    192 MiB input does not fit the default plan in one process (~1.7 GiB) and is evaluated with a smaller
    one; a 3 GiB input cannot even be allocated: too large for this device, a runtime_error."""
    config = replace(BASE, memory_limit_gb=2)
    with Evaluator(config, spares=0) as ev:
        task = row_sum_task(192 * MiB)
        result = ev.evaluate(task, identity_candidate(task.source))
        assert result.correct, result.summary()
        plan = plan_of(result)
        assert not plan["default"] and plan["process_limit_bytes"] < 2 * 2**30, plan
        assert max(plan["reference_bytes"], plan["candidate_bytes"]) <= plan["process_limit_bytes"]
        huge = row_sum_task(3 * 2**30)
        result = ev.evaluate(huge, identity_candidate(huge.source))
    assert result.error_kind == "runtime_error" and not result.compiled, result.summary()
    assert "too large for this device" in result.error and "running the reference" in result.error


def test_gpu_memory_tests_setup_dry_run_on_cpu(evaluator):
    """What ``tests/test_evaluation_memory_gpu.py`` builds, at an H200's size (139.8 GiB): the RMSNorm
    shapes, generated tasks of a quarter's estimated peak (they load as tasks); and on CPU, scaled
    down, the RMSNorm (outputs as large as inputs) under a budget below its default plan (~0.18 GiB;
    the smallest ~0.1 GiB, most of it the comparison's scratch): correct, fewer checked calls. A
    generated task's code runs through the evaluator at its small size."""
    from memory_tasks import rmsnorm_task

    from autoprofiler.generate import GenerateConfig, generate_task
    from autoprofiler.tasks import Task

    total = int(139.8 * 2**30)
    assert rmsnorm_task(total // 8).id == "tests/rmsnorm_280x64x512x512"  # 17.5 GiB in, 17.5 GiB out
    config = GenerateConfig(peak_gib=total / 4 / 2**30, max_tensor_elems=2**34)
    generated = [generate_task(seed, config=config) for seed in range(4)]
    assert all(abs(g.est_full_peak_gib - total / 4 / 2**30) < 1.0 for g in generated)
    tasks = [Task.from_source(f"generated/seed{s}", g.code, level=1) for s, g in enumerate(generated)]
    result = evaluator.evaluate(tasks[3], identity_candidate(tasks[3].source))
    assert result.correct and plan_of(result)["default"], result.summary()

    small = rmsnorm_task(4 * MiB)
    result = evaluator.evaluate(
        small, identity_candidate(small.source), config=replace(BASE, memory_budget_gb=0.11)
    )
    assert result.correct, result.summary()
    plan = plan_of(result)
    assert not plan["default"] and plan["checked_calls"] < 3, plan  # its outputs are as large as inputs


DATA_LIMIT_PROBE = """
import resource, sys, threading
import torch
from autoprofiler.evaluation import _harness
ballast = torch.ones(3 * 2**28, dtype=torch.uint8)  # 768 MiB held before the limit, like a CUDA context
held = _harness.role_module("memory").proc_status_bytes("VmData")
said = _harness.cuda_data_limit(torch, torch.device("cpu"), 0.5)
soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
threads = [threading.Thread(target=lambda: None) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
torch.empty(256 * 2**20, dtype=torch.uint8).fill_(1)  # within the half GiB of headroom
try:
    torch.empty(2**30, dtype=torch.uint8).fill_(1)
    beyond = "allocated"
except (MemoryError, RuntimeError):
    beyond = "refused"
print(said, held > 2**29, soft == hard and soft - held >= 2**29 - 2**20, beyond, sep="|")
"""


def test_data_limit_is_headroom_beyond_what_the_worker_holds():
    """``cuda_data_limit`` sets ``RLIMIT_DATA`` to the limit beyond the memory the warmed worker holds
    (a CUDA context and its libraries count against it), so a worker already holding more than the
    limit still starts threads and allocates within it, and an allocation beyond it fails (run in a
    subprocess on CPU: the limit would outlive the test)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", DATA_LIMIT_PROBE], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    said, held_more, headroom, beyond = out.stdout.strip().splitlines()[-1].split("|")
    assert said.startswith("RLIMIT_DATA 0.5 GiB beyond"), said
    assert (held_more, headroom, beyond) == ("True", "True", "refused")


def test_memory_ledger_waits_for_room_beside_other_evaluations(tmp_path):
    """With a ``memory_ledger``, a plan counts the other live evaluations' reservations: while another
    process (this test's) reserves all the machine's memory, an evaluation that fits alone waits, and it
    runs, correct, once the reservation goes, with its own plan reserved; one that never gets room is
    the evaluator's error (no row), not the candidate's."""
    import threading
    import time

    from autoprofiler.evaluation import EvaluatorError
    from autoprofiler.evaluation._memory import SAFETY, meminfo_bytes

    ledger = role_module("ledger")
    matmul_task = load_tiny_task("matmul")
    path = tmp_path / "ledger.json"
    everything = {ledger.process_key(os.getpid()): int(SAFETY * meminfo_bytes("MemTotal"))}
    path.write_text(json.dumps(everything))
    config = replace(BASE, memory_ledger=str(path), timeout_s=12.0)  # waits up to 3 s
    with Evaluator(config, spares=1) as ev:
        ev.warm_up()  # a ready pair: the plan is made within a fraction of a second of the call
        timer = threading.Timer(1.5, lambda: path.write_text("{}"))
        timer.start()
        t0 = time.monotonic()
        result = ev.evaluate(matmul_task, identity_candidate(matmul_task.source))
        timer.join()
        assert result.correct, result.summary()
        assert time.monotonic() - t0 >= 1.5 and result.details["phase_s"]["waiting for device memory"] > 0.5
        (key, reserved), *others = json.loads(path.read_text()).items()  # its reference process's plan
        assert not others and key != ledger.process_key(os.getpid()) and reserved > 0
        path.write_text(json.dumps(everything))
        with pytest.raises(EvaluatorError, match="no room for this task beside the other evaluations") as err:
            ev.evaluate(matmul_task, identity_candidate(matmul_task.source))
        assert err.value.cause == "no_room"  # typed through the sandboxed process and the parent


@pytest.mark.parametrize(
    "beside, out_of_memory, kind, expected",
    [
        ((5, 60 * 2**30), True, "runtime_error", "evaluator_error"),  # crowded out: not the candidate's
        (None, True, "runtime_error", "runtime_error"),  # alone: its own failure
        ((5, 20 * 2**30), True, "runtime_error", "runtime_error"),  # its share alone was no larger
        ((5, 60 * 2**30), False, "runtime_error", "runtime_error"),  # not an allocation failure
        ((5, 60 * 2**30), True, "compile_error", "evaluator_error"),  # constructing ModelNew, crowded out
        ((5, 60 * 2**30), True, "suspicious", "suspicious"),
    ],
)
def test_out_of_memory_at_a_share_shrunk_beside_others_is_the_evaluators_error(
    beside, out_of_memory, kind, expected
):
    """The candidate's process running out of memory at a share that other evaluations' reservations
    shrank (21 GiB, 60 GiB alone) is the evaluator's error, so nothing is recorded, and says the plan and
    headroom the share came from; alone, or for any other failure, the candidate's outcome stands."""
    referee = object.__new__(role_module("reference").Referee)  # only the fields candidate_failure reads
    referee.details = {"memory_plan": {"candidate_bytes": 14 * 2**30, "headroom_bytes": 7 * 2**30}}
    referee.built, referee.beside, referee.cfg = True, beside, {}  # no ledger: nothing beside it now
    referee.candidate_memory = {"cap_bytes": 21 * 2**30}
    failed = {"op": "failed", "kind": kind, "error": "timing: out of memory", "out_of_memory": out_of_memory}
    failure = referee.candidate_failure(failed)
    assert failure.kind == expected
    assert referee.failed(failure).get("cause") == (
        "candidate_crowded_out" if expected == "evaluator_error" else None
    )
    if expected == "evaluator_error":
        assert "share of 21 GiB" in failure.message and "shrunk from 60 GiB alone" in failure.message
        assert "(its plan 14 GiB, headroom 7 GiB)" in failure.message  # was the cap squeezed? a log tells


def ledger_with_another(tmp_path, held: int | None) -> str:
    """A ``memory_ledger`` file listing one other live evaluation (this test's parent process) holding
    ``held`` bytes, or none when ``held`` is None."""
    ledger = role_module("ledger")
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({ledger.process_key(os.getppid()): held} if held is not None else {}))
    return str(path)


@pytest.mark.parametrize("built", [True, False])
def test_out_of_memory_beside_evaluations_started_after_the_plan_is_the_evaluators_error(tmp_path, built):
    """A plan made alone gives the candidate the whole budget, but evaluations started after it may fill
    the device while the candidate is within its share (on an H100 a candidate failed allocating 3 GiB
    at a 13.3 GiB share holding 7.5 GiB, 0.4 GiB free on the device). With another evaluation in the
    ledger at the time of the failure, the candidate's allocation failure and the reference process's,
    before or after the build, are the evaluator's error (evaluated again, last alone); alone they stay
    the candidate's runtime_error and the reference's report."""
    referee = object.__new__(role_module("reference").Referee)
    referee.built, referee.beside, referee.phase_name, referee.details = built, None, "timing", {}
    referee.candidate_memory = {"cap_bytes": 13 * 2**30}
    failed = {"op": "failed", "kind": "runtime_error", "error": "timing: OOM", "out_of_memory": True}
    for other_evaluation in (True, False):
        referee.cfg = {"memory_ledger": ledger_with_another(tmp_path, 2**30 if other_evaluation else None)}
        failure = referee.candidate_failure(failed)
        result = referee.out_of_memory(MemoryError("CUDA out of memory. Tried to allocate 3.00 GiB"))
        if other_evaluation:
            assert failure.kind == "evaluator_error" and failure.cause == "candidate_crowded_out"
            assert "while 1 other evaluation on the device may have filled it" in failure.message
            assert result["error_kind"] == "evaluator_error" and result["cause"] == "reference_crowded_out"
            assert result["compiled"] == built
        else:
            assert failure.kind == "runtime_error", failure.message
            assert result["error_kind"] == "runtime_error" and "cause" not in result


ONE_GIB_TASK = memory.Sizes(
    inputs=2**30, outputs=2**30, peak=2**30, model=0, compare=0, flush=0, cuda=True, block_outputs=0
)


def planning_referee(ledger: str):
    """A reference process's ``Referee`` with only the fields its memory plan reads, on ``ledger``."""
    referee = object.__new__(role_module("reference").Referee)
    referee.details = {}  # no memory plan recorded
    referee.cfg = {"memory_ledger": ledger, "timeout_s": 60.0}
    referee.beside, referee.phase_name, referee.built = None, "planning", True
    return referee


@pytest.mark.parametrize("other_evaluation", [True, False])
def test_a_share_shrunk_by_memory_others_hold_is_judged_against_the_device_alone(tmp_path, other_evaluation):
    """Other evaluations shrink the candidate's share by what they already hold (the budget sees a
    quarter of an 80 GiB device free) as much as by what they reserve. With another evaluation in the
    ledger, an allocation failure at that share is the evaluator's error, judged against the share the
    whole device would give; with none, the same failure is the candidate's."""
    gib = 2**30
    path = ledger_with_another(tmp_path, gib if other_evaluation else None)
    referee, sizes = planning_referee(path), ONE_GIB_TASK
    budget = memory.Budget(pair=20 * gib, process=None, free=24 * gib, source="free", total=80 * gib)
    layout, shared = referee.choose_layout(sizes, budget, (5, 3, 1))
    assert layout is not None and shared.pair == budget.pair  # the ledger shrank nothing more
    referee.candidate_memory = {"cap_bytes": shared.pair - memory.needs(sizes, layout, 5)[0]}
    failed = {"op": "failed", "kind": "runtime_error", "error": "timing: OOM", "out_of_memory": True}
    failure = referee.candidate_failure(failed)
    if other_evaluation:
        assert failure.kind == "evaluator_error", failure.message
        assert "1 other evaluation on the device had shrunk from" in failure.message
    else:
        assert failure.kind == "runtime_error", failure.message


def test_beside_others_the_pair_reserves_its_candidates_headroom(tmp_path):
    """Beside another evaluation the pair reserves the reference's model, the candidate's and the
    candidate's headroom (one more copy of the inputs and one more forward), so that no later plan
    counts on memory this candidate may use; and the memory in use on the device that the ledger does
    not account for (CUDA contexts, caches) shrinks the room beside the others."""
    gib = 2**30
    path = ledger_with_another(tmp_path, gib)
    referee, sizes = planning_referee(path), ONE_GIB_TASK
    budget = memory.Budget(pair=40 * gib, process=None, free=60 * gib, source="free", total=80 * gib)
    layout, shared = referee.choose_layout(sizes, budget, (5, 3, 1))
    assert layout is not None and layout.full and shared.pair == budget.pair
    need = memory.needs(sizes, layout, 5)
    mine = json.loads(Path(path).read_text())[role_module("ledger").process_key(os.getpid())]
    assert mine == need[0] + need[1] + memory.headroom(sizes) == sum(need) + 2 * gib
    # 17 GiB in use beyond this process's 2 GiB of tensors and the other's 1 GiB reserved
    assert "less 17 GiB in use outside the ledger" in shared.source, shared.source
    crowded = memory.beside(replace(budget, pair=80 * gib), gib, 1, held=3 * gib)
    assert crowded.pair == int(0.85 * 64 * gib) - gib


def test_beside_others_the_layout_leaves_the_candidate_its_whole_headroom(tmp_path, monkeypatch):
    """Beside another evaluation a budget that fits the default layout only with the candidate's
    headroom cut short gets a leaner layout whose candidate keeps its model plus the whole headroom
    (on an H100, candidates ran out of memory at such squeezed shares); a budget where no layout leaves
    the headroom waits, then fails as the evaluator's error, although a squeezed plan would fit."""
    gib = 2**30
    path = ledger_with_another(tmp_path, gib)
    referee, sizes = planning_referee(path), ONE_GIB_TASK
    head = memory.headroom(sizes)
    full = memory.needs(sizes, memory.choose(sizes, memory.Budget(99 * gib, None, 0, ""), 5, 3, 1), 5)
    budget = memory.Budget(
        pair=sum(full) + head - gib, process=None, free=70 * gib, source="free", total=80 * gib
    )
    assert memory.choose(sizes, budget, 5, 3, 1).full  # the default layout, were the headroom squeezed
    layout, shared = referee.choose_layout(sizes, budget, (5, 3, 1))
    need = memory.needs(sizes, layout, 5)
    assert not layout.full and sum(need) + head <= shared.pair, (layout, need)
    assert memory.candidate_share(need, shared.pair, head, True)[0] == need[1] + head

    referee.cfg["timeout_s"] = 2.0  # waits up to 0.5 s
    referee.phase = lambda name: None  # no parent to tell
    referee.tools = None
    small = memory.needs(sizes, memory.smallest(), 5)
    tight = replace(budget, pair=sum(small) + head - gib)
    monkeypatch.setattr(memory, "measure_budget", lambda tools, held, budget_gb: tight)
    assert memory.choose(sizes, tight, 5, 3, 1) is not None  # fits, with the headroom squeezed
    with pytest.raises(Failure) as failed:
        referee.choose_layout(sizes, tight, (5, 3, 1))
    assert failed.value.kind == "evaluator_error" and failed.value.cause == "no_room"


@pytest.mark.parametrize("ledger", [True, False])
def test_alone_the_layout_leaves_the_headroom_when_the_room_allows(tmp_path, ledger):
    """Alone on the device (an empty ledger, or none) the candidate may take all the room the reference
    leaves; when memory held outside the ledger makes that less than its model plus its headroom under
    the default layout, a leaner layout that leaves the headroom is chosen (on an H100 a ``keep``
    candidate planned alone ran out of memory at 19.3 GiB against a plan of 18.3 + 3.0 GiB). Where no
    layout leaves it, the largest that fits at all is taken rather than failing the task."""
    gib = 2**30
    referee, sizes = planning_referee(ledger_with_another(tmp_path, None) if ledger else None), ONE_GIB_TASK
    head = memory.headroom(sizes)
    full = memory.needs(sizes, memory.choose(sizes, memory.Budget(99 * gib, None, 0, ""), 5, 3, 1), 5)
    budget = memory.Budget(pair=sum(full) + head - gib, process=None, free=40 * gib, source="free")
    assert memory.choose(sizes, budget, 5, 3, 1).full  # the default layout, were the headroom squeezed
    layout, shared = referee.choose_layout(sizes, budget, (5, 3, 1))
    need = memory.needs(sizes, layout, 5)
    assert not layout.full and shared.pair == budget.pair
    cap = memory.candidate_share(need, shared.pair, head, crowded=False)[0]
    assert cap >= need[1] + head, (layout, need, cap)

    small = memory.needs(sizes, memory.smallest(), 5)
    tight = replace(budget, pair=sum(small) + head - gib)
    layout, shared = referee.choose_layout(sizes, tight, (5, 3, 1))
    assert layout == memory.choose(sizes, tight, 5, 3, 1) is not None  # squeezed, but evaluated
    assert memory.candidate_share(memory.needs(sizes, layout, 5), tight.pair, head, False)[0] < (
        memory.needs(sizes, layout, 5)[1] + head
    )


def test_out_of_memory_while_sending_outputs_says_so():
    """An allocation failing while the candidate's process packs its kept outputs (as it does on a
    crowded device) reaches the reference process marked ``out_of_memory`` with the share it had, like
    a failure while timing, so ``candidate_failure`` can judge it crowded out."""
    import torch

    candidate = role_module("candidate")
    sent = []

    class Link:
        def send(self, msg, fds=()):
            sent.append(msg)

    process = candidate.CandidateProcess({"config": {"device": "cpu"}}, Tools(torch, "cpu"), Link())
    process.cap = 21 * 2**30
    process.kept = {0: torch.zeros(4)}

    def pack_outputs(values):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.69 GiB.")

    process.pack_outputs = pack_outputs
    with pytest.raises(candidate._Stop):  # the serve loop then waits for the reference process
        process.kept_call({"call": 0})
    (failed,) = sent
    assert failed["op"] == "failed" and failed["kind"] == "runtime_error", failed
    assert failed["out_of_memory"] is True and "sending the timed outputs" in failed["error"]
    assert "(its share of device memory: 21 GiB)" in failed["error"], failed["error"]


@pytest.mark.parametrize("other_evaluation", [True, False])
def test_too_large_for_the_memory_others_hold_waits_and_is_the_evaluators_error(
    tmp_path, monkeypatch, other_evaluation
):
    """A task that does not fit the memory free now (2 GiB of an 80 GiB device) but fits the device
    alone: with another evaluation in the ledger, what that one holds is why, so the plan waits for room
    and, given none, fails as the evaluator's error (nothing recorded, evaluated again later); with
    none, the device is simply too small for it now, and the plan says so at once (``None``)."""
    gib = 2**30
    path = ledger_with_another(tmp_path, gib if other_evaluation else None)
    referee = object.__new__(role_module("reference").Referee)
    referee.details = {}  # no memory plan recorded
    referee.cfg = {"memory_ledger": path, "timeout_s": 2.0}  # waits up to 0.5 s
    referee.beside, referee.phase_name, referee.built, referee.tools = None, "planning", True, None
    referee.phase = lambda name: None  # no parent to tell
    sizes = memory.Sizes(
        inputs=4 * gib, outputs=gib, peak=gib, model=0, compare=0, flush=0, cuda=True, block_outputs=0
    )
    budget = memory.Budget(pair=2 * gib, process=None, free=2 * gib, source="free", total=80 * gib)
    assert memory.choose(sizes, budget, 5, 3, 1) is None
    monkeypatch.setattr(memory, "measure_budget", lambda tools, held, budget_gb: budget)
    if other_evaluation:
        with pytest.raises(Failure) as failed:
            referee.choose_layout(sizes, budget, (5, 3, 1))
        assert failed.value.kind == "evaluator_error" and "no room for this task" in failed.value.message
        assert failed.value.cause == "no_room"
    else:
        assert referee.choose_layout(sizes, budget, (5, 3, 1)) == (None, budget)


OOM_TAIL = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB."


@pytest.mark.parametrize(
    "beside, tail, expected",
    [
        ((5, 60 * 2**30), OOM_TAIL, "evaluator_error"),
        ((5, 60 * 2**30), "Segmentation fault", "crashed"),  # died of something else
        (None, OOM_TAIL, "crashed"),  # alone
        ((5, 20 * 2**30), "CUDA out of memory", "crashed"),  # its share alone was no larger
    ],
)
def test_candidate_killed_by_an_allocation_at_a_crowded_share_is_the_evaluators_error(beside, tail, expected):
    """The candidate's process dies of a failed allocation (its log ends in CUDA's out-of-memory error,
    as a CUDA graph capture that runs out does): at a share other evaluations had shrunk (21 GiB, 60 GiB
    alone) that is the evaluator's error (no row; evaluated again, last alone); alone, at a share no
    smaller than alone, or of anything else, it is the candidate's crash."""
    from autoprofiler.evaluation.evaluator import candidate_died

    referee = object.__new__(role_module("reference").Referee)  # only the fields failed() reads
    referee.details = {}  # no memory plan recorded
    referee.built, referee.beside, referee.cfg = True, beside, {}  # no ledger: nothing beside it now
    referee.candidate_memory = {"cap_bytes": 21 * 2**30}
    died = Failure("crashed", "the candidate's process died during correctness trial 0", compiled=True)
    died.candidate_died = True
    raw = referee.failed(died)
    assert raw["candidate_died"] and ("crowded" in raw) == (beside == (5, 60 * 2**30))
    candidate_died(raw, "exit code 1", tail, out_of_memory=tail != "Segmentation fault")
    assert raw["error_kind"] == expected and tail in raw["error"]
    assert raw.get("cause") == ("candidate_crowded_out" if expected == "evaluator_error" else None)
    if expected == "evaluator_error":
        assert raw["error"].startswith("the candidate's process ran out of memory at its share of 21 GiB")


def test_an_out_of_memory_error_is_found_before_the_tail_the_error_shows(tmp_path):
    """CUDA's out-of-memory message lists every process on the device after its first line: with tens of
    processes (22 on the H200, 2026-12-07) its head lies about 1,500 characters before the log's end, so
    the tail shown in the error lacks it. The candidate's death is still found to be an allocation's,
    and at a crowded share it is the evaluator's error (it was once recorded as the candidate's crash)."""
    from autoprofiler.evaluation.evaluator import _OUT_OF_MEMORY, candidate_died
    from autoprofiler.evaluation.workers import Worker

    listing = " ".join(f"Process {2000 + i} has 720.00 MiB memory in use." for i in range(30))
    message = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        f"of 139.80 GiB of which 59.88 GiB is free. {listing} 12.52 GiB allowed; Of the allocated memory "
        "12.30 GiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated."
    )
    worker = object.__new__(Worker)  # only the log files are read
    worker.tmp = tmp_path
    (tmp_path / "stderr.log").write_text("Traceback (most recent call last):\n" + message + "\n")
    tail = worker.log_tail()
    assert "CUDA out of memory" not in tail and "allowed" in tail  # the head is cut off what is shown
    assert worker.log_mentions(_OUT_OF_MEMORY) and not worker.log_mentions(("Segmentation fault",))
    raw = {"error": "the candidate's process died during correctness trial 0", "error_kind": "crashed"}
    raw["crowded"] = "the candidate's process ran out of memory at its share of 12.5 GiB"
    candidate_died(raw, "exit code 1", tail, worker.log_mentions(_OUT_OF_MEMORY))
    assert raw["error_kind"] == "evaluator_error" and raw["cause"] == "candidate_crowded_out"


@pytest.mark.parametrize("other_evaluation", [True, False])
def test_reference_out_of_memory_before_the_build_beside_others_is_the_evaluators_error(
    tmp_path, other_evaluation
):
    """The reference process runs out of memory running the reference, before any plan: beside another
    evaluation in the ledger that may be all the memory it lacked (the evaluator's error, evaluated
    again, last alone); alone the task is too large for the device (the task's runtime_error)."""
    path = ledger_with_another(tmp_path, 2**30 if other_evaluation else None)
    referee = object.__new__(role_module("reference").Referee)  # only the fields out_of_memory reads
    referee.cfg = {"memory_ledger": path}
    referee.built, referee.phase_name, referee.details = False, "running the reference", {}
    result = referee.out_of_memory(MemoryError("CUDA out of memory. Tried to allocate 1.50 GiB"))
    if other_evaluation:
        assert result["error_kind"] == "evaluator_error" and result["cause"] == "reference_crowded_out"
        assert "beside 1 other evaluation on the device" in result["error"], result["error"]
    else:
        assert result["error_kind"] == "runtime_error"
        assert result["error"].startswith("the task is too large for this device"), result["error"]


def test_the_evaluators_causes_are_named_alike_on_both_sides():
    """The reference process (``_memory``, standard library only) and the parent (``EVALUATOR_CAUSES``)
    name the same causes, and the recording's retry log has a short name for each."""
    from autoprofiler.environments.recording import _WHY_FAILED
    from autoprofiler.evaluation.results import EVALUATOR_CAUSES, EvaluatorError

    named = {memory.CANDIDATE_CROWDED_OUT, memory.REFERENCE_CROWDED_OUT, memory.NO_ROOM}
    assert named == set(EVALUATOR_CAUSES) == set(_WHY_FAILED)
    with pytest.raises(ValueError, match="cause: expected one of"):
        EvaluatorError("x", cause="out of memory")


def test_memory_crowding_sorts_the_h100_recordings_failures():
    """bench/memory_crowding.py over the H100 recorder logs of 2026-12-07f: each allocator failure is
    device full (it tried more than the device had free) or over its share (the device had room), as
    ``bench/results/memory_crowding_h100.md`` reports; a missing log is a one-line error."""
    from conftest import load_script

    root = Path(__file__).resolve().parents[1]
    crowding = load_script(root / "bench" / "memory_crowding.py", register=True)
    logs = sorted((root / "datasets/recorded/h100/logs").glob("recorder_2026-12-07f_call*.log"))
    failures = [f for log in logs for line in log.open() if (f := crowding.parse_line(line))]
    verdicts = Counter((f.process, f.verdict) for f in failures)
    assert verdicts == {
        ("candidate", "device full"): 15,
        ("candidate", "over its share"): 21,
        ("reference", "device full"): 2,
    }
    assert not any(f.action == "keep" and f.verdict == "over its share" for f in failures)
    assert crowding.parse_line("12:00:00 INFO recorded tasks 1-16 of 431") is None
    assert {f.squeezed for f in failures} == {None}  # logged before the lines said the plan
    line = (
        "the evaluator failed: t action 'cuda_graph', ...: the candidate's process ran out of memory at its "
        "share of {} GiB, which 2 other evaluations ... again (its plan 6 GiB, headroom 3 GiB): ..."
    )
    assert [crowding.parse_line(line.format(cap)).squeezed for cap in ("8.36", "9")] == [True, False]
    assert crowding.main([str(root / "no-such.log")]) == 2
    # the passes of the 2026-12-07f calls: first-pass cells and the evaluator's failures in them
    passes = [crowding.passes(log) for log in logs]
    assert [(p.first_cells, p.failed_first, p.failed_again) for p in passes] == [
        (3, 2, 1),
        (50, 18, 8),
        (0, 0, 0),
        (60, 9, 0),
    ]


def test_memory_crowding_reads_the_recordings_memory_lines(tmp_path):
    """The "memory:" lines the recording writes (``recording.memory_line``) are what the bench reads:
    peak over plan by action and where, how many exceeded plan plus headroom, and how many had a cap
    below it."""
    from conftest import load_script

    from autoprofiler.cells import Cell
    from autoprofiler.environments.recording import memory_line
    from autoprofiler.tasks import Task

    crowding = load_script(
        Path(__file__).resolve().parents[1] / "bench" / "memory_crowding.py", register=True
    )
    task = Task("torch#1/row2", "", "h", 1)
    k = "candidate_peak_reserved_bytes"
    plan = {"candidate_bytes": 2 * 2**30, "headroom_bytes": 2**29, "candidate_cap_bytes": 5 * 2**29}
    lines = [
        memory_line(
            Cell(task, rewriter="r", action="cuda_graph"), {**plan, "beside_others": True, k: 3 * 2**30}
        ),
        memory_line(
            Cell(task, rewriter="r", action="cuda_graph"),
            {**plan, "beside_others": True, "candidate_cap_bytes": 2**31, k: 2**31},
        ),
        memory_line(Cell(task, rewriter="r", action="keep"), {**plan, "candidate_cap_bytes": None, k: 2**30}),
    ]
    log = tmp_path / "recorder.log"
    log.write_text("".join(f"12:00:00 INFO autoprofiler.environments.recording:   {ln}\n" for ln in lines))
    table = crowding.peaks_table([log])
    assert "| cuda_graph | beside others | 2 | 1.25 | 1.50 | 1 | 1 |" in table, table
    assert "| keep | alone | 1 | 0.50 | 0.50 | 0 | 0 |" in table, table
