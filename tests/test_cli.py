"""The CLI's user path: one line per task, summaries that keep failures apart, exit codes, and the
environment errors (end-to-end profiling and optimizing on CPU: test_tree.py, test_readme.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from autoprofiler.cells import Cell, RewardRow
from autoprofiler.cli import (
    EXIT_BAD_INPUT,
    EXIT_INCORRECT,
    EXIT_OK,
    _format_row,
    _format_summary,
    _optimize_exit,
    _route_summary,
    _summary,
)
from autoprofiler.optimize import Optimized, result_row
from autoprofiler.tasks import Task

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "replay"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autoprofiler", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def results() -> list[Optimized]:
    a, b, c = (Task.from_source(f"suite/{n}", f"# {n}") for n in ("a", "b", "c"))
    return [
        Optimized(a, RewardRow.build(Cell(a, (), "r"), correct=True, speedup=2.0), passes=3, leaf="memory"),
        Optimized(b, None, f"missing_profile: runs/rec holds no profile of this task (hash {b.hash})"),
        Optimized(c, None, "profile_error: MissingProfile: " + "x" * 400 + f" {c.hash} tail"),
    ]


def test_a_failed_task_is_one_line_with_its_reason_whole():
    """A failure's line: FAILED, its kind once, the reason cut at a word (never inside the hash)."""
    a, b, c = (result_row(r) for r in results())
    assert _format_row(a, 12).endswith("action=-  correct, speedup 2.000x")
    line = _format_row(b, 12)
    assert line == (
        f"suite/b      FAILED missing_profile: runs/rec holds no profile of this task (hash {b['task_hash']})"
    )
    long = _format_row(c, 12)
    assert long.count("profile_error") == 1 and long.endswith("MissingProfile: ...") and "\n" not in long


def test_the_summary_keeps_failures_apart_and_the_exit_code_says_so():
    """1 of 3 evaluated: its numbers over that one; the 2 without a result counted by kind, not in the
    numbers; a missing input exits 2, another failure 1, none 0."""
    summary = _summary(results())
    text = _format_summary(summary)
    assert text.startswith("1 of 3 tasks evaluated: correct 1/1 (100%), geomean effective speedup 2.000x")
    assert text.endswith(
        "; 2 of 3 FAILED without a result (missing_profile 1, profile_error 1), not counted in these numbers"
    )
    rows = [result_row(r) for r in results()]
    assert _optimize_exit(rows) == EXIT_BAD_INPUT
    lost = {**rows[1], "error_kind": "worker_lost"}
    assert _optimize_exit([rows[0], lost]) == EXIT_INCORRECT
    assert _optimize_exit([rows[0], rows[0]]) == EXIT_OK
    assert _format_summary(_summary(results()[1:])) == (
        "no task was evaluated (0 of 2); 2 of 2 FAILED without a result (missing_profile 1, "
        "profile_error 1), not counted in these numbers"
    )


def test_route_summary_counts_tasks_per_leaf():
    """The last line of ``route`` over a folder: tasks per leaf (most first), failures, mean cost."""
    setup = {"tree_path": "trees/seed_torch.json"}
    text = _route_summary(["memory", "compute", "memory"], 1, setup, 3.0, 6)
    assert text == (
        "3 tasks routed by trees/seed_torch.json: memory 2, compute 1; 1 failed; "
        "mean 1.00 s and 2.0 passes per task"
    )


def test_optimize_on_a_recording_without_the_tasks_is_bad_input_before_any_work():
    """--profiles that holds none of the tasks: exit 2, one line saying how to pick recorded ones."""
    proc = cli("optimize", "datasets/suite", "--filter", "relu", "--profiles", str(FIXTURE))
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert (
        proc.stderr.strip().count("\n") == 0
        and "holds no torch profile of any of the 1 task(s)" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["profile", "optimize"])
def test_cuda_without_a_gpu_is_one_line_exit_3(command):
    """--device cuda where torch sees none: one line (exit 3), no subprocess traceback (``profile`` used
    to start the profiled program first; route, optimize and eval share ``_resolve_device``)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = cli(command, "datasets/suite/l1/relu.py", "--device", "cuda")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith(
        "error: --device cuda but torch sees no CUDA device"
    ) and "Traceback" not in (proc.stderr)
    assert proc.stderr.strip().count("\n") == 0


def test_differing_torch_operator_lists_are_not_a_warning(caplog):
    """Merging two torch.profiler runs whose operator lists differ keeps the first table, logged at INFO
    (it blamed cuDNN, at WARNING, on machines without a GPU)."""
    from autoprofiler.profiling.profile import Profile

    one, two = (
        Profile("h-cli-merge", "torch", frozenset({group}), {}, kernels=[{"name": name}])
        for group, name in (("torch_root", "a"), ("torch_ops", "b"))
    )
    with caplog.at_level(logging.INFO, logger="autoprofiler.profiling.profile"):
        merged = one.merge(two)
    assert merged.kernels == [{"name": "a"}]
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "cuDNN" not in caplog.text and "operator lists differ" in caplog.text
