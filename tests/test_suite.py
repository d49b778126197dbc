"""The starter suite under datasets/suite: every task loads, covers the tiers, dtypes and regimes it
claims, honours AUTOPROFILER_TASK_SIZE, and at size small runs on CPU finitely, deterministically
and fast."""

import re
import time
import types
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import load_script

from autoprofiler.tasks import load_task_folder

SUITE = Path(__file__).resolve().parents[1] / "datasets" / "suite"
REPORT = load_task_folder(SUITE)
TASKS = list(REPORT)
REGIMES = {"compute-bound", "memory-bound", "latency-bound"}
DTYPES = {"fp32", "fp16", "bf16"}
SMALL_FORWARD_LIMIT_S = 0.05


def import_task(task, size: str, monkeypatch) -> types.ModuleType:
    """Execute the task source in a fresh module with AUTOPROFILER_TASK_SIZE=size (read at import)."""
    monkeypatch.setenv("AUTOPROFILER_TASK_SIZE", size)
    module = types.ModuleType(f"suite_task_{task.hash}_{size}")
    exec(compile(task.source, task.origin, "exec"), module.__dict__)
    return module


def build_and_run(module, seed: int = 0):
    """As the evaluator does: seed, construct Model, seed, get_inputs, forward."""
    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
    torch.manual_seed(seed)
    inputs = module.get_inputs()
    with torch.no_grad():
        output = model(*inputs)
    return model, inputs, output


def test_suite_loads_cleanly_with_enough_tasks_per_tier():
    """At least 30 tasks, no load errors, unique ids suite/lN/name, >= 8 per tier, level matches folder."""
    assert REPORT.errors == []
    assert len(TASKS) >= 30
    ids = [task.id for task in TASKS]
    assert len(set(ids)) == len(ids)
    for task in TASKS:
        assert re.fullmatch(r"suite/l[123]/[a-z0-9_]+", task.id), task.id
        assert task.id.startswith(f"suite/l{task.level}/"), (task.id, task.level)
    per_level = Counter(task.level for task in TASKS)
    assert min(per_level[level] for level in (1, 2, 3)) >= 8, per_level


def test_every_task_declares_one_regime_and_one_dtype():
    """Tags name exactly one expected regime and one dtype; the suite mixes all regimes and dtypes."""
    for task in TASKS:
        assert len(REGIMES & set(task.tags)) == 1, (task.id, task.tags)
        assert len(DTYPES & set(task.tags)) == 1, (task.id, task.tags)
    regimes = Counter(tag for task in TASKS for tag in task.tags if tag in REGIMES)
    assert min(regimes.values()) >= 5 and set(regimes) == REGIMES, regimes
    dtypes = Counter(tag for task in TASKS for tag in task.tags if tag in DTYPES)
    assert dtypes["bf16"] >= 3 and dtypes["fp16"] >= 3, dtypes
    assert sum("algorithmic" in task.tags for task in TASKS) >= 5


def test_readme_lists_every_task():
    """datasets/suite/README.md has a table row for each task id (kept in sync with the files)."""
    readme = (SUITE / "README.md").read_text()
    listed = set(re.findall(r"^\| (suite/l[123]/\w+) \|", readme, flags=re.MULTILINE))
    assert listed == {task.id for task in TASKS}


@pytest.mark.parametrize("task", TASKS, ids=[task.id for task in TASKS])
def test_task_size_switch_changes_the_shapes(task, monkeypatch):
    """Importing at size full and small gives different module-level size constants (no inputs are built)."""

    def constants(module):
        return {k: v for k, v in vars(module).items() if k.isupper() and isinstance(v, int | tuple)}

    full = constants(import_task(task, "full", monkeypatch))
    small = constants(import_task(task, "small", monkeypatch))
    assert full.keys() == small.keys() and full != small, (full, small)
    assert import_task(task, "small", monkeypatch).SMALL is True


@pytest.mark.parametrize("task", TASKS, ids=[task.id for task in TASKS])
def test_task_runs_small_on_cpu(task, monkeypatch):
    """Size small: CPU forward gives finite outputs, the same again from the same seed, in under 50 ms."""
    module = import_task(task, "small", monkeypatch)
    model, inputs, first = build_and_run(module)
    _, _, second = build_and_run(module)
    outputs = first if isinstance(first, tuple | list) else (first,)
    again = second if isinstance(second, tuple | list) else (second,)
    for a, b in zip(outputs, again, strict=True):
        assert isinstance(a, torch.Tensor)
        assert torch.isfinite(a.float()).all(), task.id
        assert torch.equal(a, b), f"{task.id} is not deterministic for a fixed seed"
    floating = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if floating:  # the output dtype follows the task's declared dtype
        declared = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        (tag,) = DTYPES & set(task.tags)
        assert floating[0].dtype == declared[tag], (task.id, floating[0].dtype)
    # One thread, CPU time, best of 5: robust to other processes competing for this machine's cores
    # (with two OpenMP threads a descheduled sibling makes the other spin, inflating even CPU time)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    samples = []
    try:
        with torch.no_grad():
            for _ in range(5):
                start = time.process_time()
                model(*inputs)
                samples.append(time.process_time() - start)
    finally:
        torch.set_num_threads(threads)
    seconds = min(samples)
    assert seconds < SMALL_FORWARD_LIMIT_S, f"{task.id}: {seconds * 1e3:.1f} ms CPU time at size small"


def test_a_different_seed_gives_different_inputs(monkeypatch):
    """Inputs come from torch's RNG only: another seed changes them (the evaluator relies on that)."""
    module = import_task(next(t for t in TASKS if t.id == "suite/l1/relu"), "small", monkeypatch)
    torch.manual_seed(1)
    a = module.get_inputs()[0]
    torch.manual_seed(2)
    b = module.get_inputs()[0]
    assert not torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("task", TASKS, ids=[task.id for task in TASKS])
def test_task_runs_full_on_cuda(task, monkeypatch):
    """Size full on the GPU: finite, reproducible from the seed (within dtype tolerance), and a forward
    takes 2 us - 150 ms (target 0.1-100 ms; the tiny latency-bound tasks are below it by design)."""
    module = import_task(task, "full", monkeypatch)
    with torch.device("cuda"):
        model, inputs, first = build_and_run(module)
        second = build_and_run(module)[2]
    outputs = first if isinstance(first, tuple | list) else (first,)
    again = second if isinstance(second, tuple | list) else (second,)
    tolerance = 1e-2 if {"fp16", "bf16"} & set(task.tags) else 1e-4
    for a, b in zip(outputs, again, strict=True):
        assert torch.isfinite(a.float()).all(), task.id
        torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance)
    del second, again
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            model(*inputs)
        end.record()
        torch.cuda.synchronize()
    milliseconds = start.elapsed_time(end) / 10
    assert 0.002 < milliseconds < 150, f"{task.id}: {milliseconds:.3f} ms at size full"


def test_full_sizes_fit_the_h200_budget_by_roofline(monkeypatch):
    """Full size, on the meta device (no compute): each task's roofline estimate for an H200 is within
    3 us - 100 ms, and the roofline's bound agrees with the tagged regime for most tasks."""
    roofline = load_script(SUITE / "_estimate_roofline.py", "estimate_roofline")
    monkeypatch.setenv("AUTOPROFILER_TASK_SIZE", "full")
    disagree, out_of_budget = [], []
    for task in TASKS:
        _, _, _, milliseconds, bound = roofline.estimate(task)
        if not 0.003 < milliseconds < 100:
            out_of_budget.append((task.id, milliseconds))
        if f"{bound}-bound" not in task.tags:
            disagree.append((task.id, bound))
    assert out_of_budget == []
    assert len(disagree) <= len(TASKS) // 10, disagree
