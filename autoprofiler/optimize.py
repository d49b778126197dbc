"""Optimize tasks the way a user does: route each through a tree, rewrite once, evaluate.

``optimize`` profiles every task by the policy (batched: one profiled process per tree level), hands
each task's cell and shown profile to a runner (a ``LocalDriver`` in this process, or a ``RayDriver``
over ``GpuWorker`` actors) and returns one ``Optimized`` per task: the reward row and how the profile
was chosen. The CLI's ``optimize`` and the Serve app's ``/optimize`` call it.

    results = optimize(tasks, TreePolicy(tree), Profiler(source="torch", device="cpu"), runner, rewriter)
    results[0].row.speedup, results[0].leaf
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autoprofiler.cells import Cell, CellFailure, RewardRow, WorkItem

if TYPE_CHECKING:
    from autoprofiler.policies import Selection, TreePolicy
    from autoprofiler.rewriters.base import Rewriter
    from autoprofiler.runtime.driver import Runner
    from autoprofiler.tasks import Task

__all__ = ["Optimized", "optimize", "result_row"]


@dataclass(frozen=True)
class Optimized:
    """One task's outcome: its reward row, or why it has none (``failure``), and the tree's choice.

    Attributes:
        task: the task.
        row: the reward row (None when profiling, routing or the machinery failed).
        failure: "" or why there is no row (``"profile_error: ..."``, ``"task_error: ..."``).
        leaf, groups, path: the leaf reached, the groups shown, the tree path (node, feature, value,
            threshold, direction) per step.
        passes, profile_seconds: what routing and the leaf's groups cost.
    """

    task: Task
    row: RewardRow | None
    failure: str = ""
    leaf: str | None = None
    groups: tuple[str, ...] = ()
    path: tuple = ()
    passes: int = 0
    profile_seconds: float = 0.0


def _shown(selection: Selection):
    """The profile the rewriter sees, carrying what the whole selection cost (routing included)."""
    shown = selection.shown_profile()
    if shown is None:
        return None
    return dataclasses.replace(shown, passes=int(selection.passes), seconds=float(selection.seconds))


def optimize(
    tasks: Sequence[Task],
    policy: TreePolicy,
    profiler: Any,
    runner: Runner,
    rewriter: Rewriter,
    seed: int = 0,
    on_result: Callable[[Optimized], None] | None = None,
) -> list[Optimized]:
    """Route, rewrite and evaluate every task; one ``Optimized`` per task, in order.

    ``profiler`` is what the policy collects from (a ``Profiler``, or a ``RecordedProfiler`` over a
    recording). Profiling or routing failures are data (``Optimized.failure``); environment errors of
    the profiler (no ncu, counters not permitted) raise. ``on_result`` is called with each task's
    outcome as it is known (in the calling thread; evaluations finish in any order), so a caller can
    print one line per task while the rest still run.
    """
    from autoprofiler.profiling import CountersNotPermitted, NcuNotFound

    selections = policy.select_many(list(tasks), profiler)
    for selection in selections:
        if isinstance(selection, NcuNotFound | CountersNotPermitted):
            raise selection
    out: list[Optimized | None] = [None] * len(tasks)

    def done(i: int, result: Optimized) -> None:
        out[i] = result
        if on_result is not None:
            on_result(result)

    items, index = [], {}
    for i, (task, sel) in enumerate(zip(tasks, selections, strict=True)):
        if isinstance(sel, Exception):
            done(i, Optimized(task, None, f"profile_error: {type(sel).__name__}: {sel}"))
            continue
        cell = Cell(task, sel.groups, rewriter.identity, seed, 0, policy=policy.name)
        if cell.key not in index:  # two tasks of the same content: one evaluation answers both
            items.append(WorkItem(cell, _shown(sel)))
        index.setdefault(cell.key, []).append(i)

    def arrived(result: RewardRow | CellFailure) -> None:
        for i in index[result.key]:
            sel = selections[i]
            choice = {
                "leaf": sel.leaf,
                "groups": tuple(sel.groups),
                "path": tuple(tuple(step) for step in sel.trace),
                "passes": int(sel.passes),
                "profile_seconds": float(sel.seconds),
            }
            if isinstance(result, CellFailure):
                done(i, Optimized(tasks[i], None, f"{result.kind}: {result.message}", **choice))
            else:
                done(i, Optimized(tasks[i], result, **choice))

    if items:
        results = runner.run_cells(items, on_result=arrived)
        for item, result in zip(items, results, strict=True):  # any the runner did not call back for
            if out[index[item.cell.key][0]] is None:
                arrived(result)
    return [r for r in out if r is not None]


def result_row(result: Optimized) -> dict[str, Any]:
    """A flat dict for tables and JSON: the task, the tree's choice and the outcome."""
    row = result.row
    return {
        "task": result.task.id,
        "task_hash": result.task.hash,
        "leaf": result.leaf,
        "groups": "+".join(result.groups),
        "passes": result.passes,
        "profile_s": round(result.profile_seconds, 3),
        "action": row.action if row else "",
        "compiled": bool(row and row.compiled),
        "correct": bool(row and row.correct),
        "error_kind": (row.error_kind if row else result.failure.split(":")[0]) or None,
        "error": row.error if row else result.failure,
        "ref_ms": row.ref_ms if row else None,
        "new_ms": row.new_ms if row else None,
        "speedup": row.speedup if row else None,
        "reward": row.reward if row else 0.0,
        "effective_speedup": row.effective_speedup if row else 1.0,
        "llm_calls": row.llm_calls if row else 0,
        "prompt_tokens": row.prompt_tokens if row else 0,
        "completion_tokens": row.completion_tokens if row else 0,
        "eval_s": round(row.eval_seconds or 0.0, 3) if row else 0.0,
        "key": row.key if row else "",
        "path": [list(step) for step in result.path],
        "failed": result.row is None,
    }
