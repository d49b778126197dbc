"""Recording a suite: every task with every metric group, every rule action, every fixed configuration.

``record`` drives a live environment over a suite; what it writes (``profiles/``, ``rewards/``,
``candidates/``) is what a ``ReplayEnvironment`` answers from (``datasets/h200_suite/`` was made so).
Everything is keyed, so calling it again resumes; ``max_seconds`` stops starting new work after that
long, and a profiled batch only when the longest batch so far would still finish in time (a device call
with a hard limit is then not killed in the middle of one); ``summary["complete"]`` says whether
everything was done.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autoprofiler.cells import Cell, CellFailure, RewardRow
from autoprofiler.environments.environment import Environment, configuration_groups
from autoprofiler.evaluation._memory import gib
from autoprofiler.evaluation.results import CANDIDATE_CROWDED_OUT, NO_ROOM, REFERENCE_CROWDED_OUT
from autoprofiler.rewriters.base import ActionRewriter
from autoprofiler.runtime.driver import BatchClock
from autoprofiler.tables import RewardTable
from autoprofiler.tasks import Task
from autoprofiler.text import first_line

__all__ = ["action_cells", "derive_configuration_rows", "record"]

logger = logging.getLogger(__name__)


def action_cells(
    tasks: Sequence[Task],
    rewriter: ActionRewriter,
    seeds: Sequence[int] = (0,),
    actions: Sequence[str] | None = None,
) -> list[Cell]:
    """One action cell per (task, seed, action) of a rule rewriter (``actions``: a subset; None: all)."""
    return [
        Cell(t, (), rewriter.actions_identity, seed, 0, action, policy="action")
        for t in tasks
        for seed in seeds
        for action in (rewriter.actions() if actions is None else actions)
    ]


def record(
    tasks: Sequence[Task],
    env: Environment,
    groups: Sequence[str],
    configurations: dict[str, Sequence[str]] | None = None,
    seeds: Sequence[int] = (0,),
    max_seconds: float | None = None,
    joint: bool = False,
    joint_batch: int = 8,
    actions: Sequence[str] | None = None,
    chunk: int | None = None,
) -> dict[str, Any]:
    """Profile every task with every group, evaluate every rule action, write every configuration's row.

    ``chunk``: record ``chunk`` tasks at a time, profiles then actions, before the next (a stop then
    leaves whole tasks; without ``joint``, each group is still its own profiled process per chunk).

    Profiles: with ``joint``, every missing group of ``joint_batch`` tasks at a time in one profiled
    process per worker (cost shared among the groups by catalog pass counts); without, one group at a
    time over the whole suite, so each group's own cost is recorded. Each batch's rows are written
    before the next starts, so a stopped run loses at most one batch. Then every (task, seed, action)
    cell goes to the environment's runner in one call (its workers evaluate them in parallel), and each
    fixed configuration's row is derived from the action its rules pick (evaluated then if ``actions``,
    a subset of the rule actions, left it out). Cells the evaluator failed (``evaluator_error``, not the
    candidate's fault) are evaluated again before the chunk ends: together, then one at a time.

    Returns a summary: counts, failures ``[{"task_id", "stage", "error"}]``, ``not_started`` (action
    cells the budget left for a resumed run), seconds, complete.
    """
    budget = _Budget(None if max_seconds is None else time.monotonic() + max_seconds)
    if chunk:
        return _record_in_chunks(
            tasks, env, groups, configurations, seeds, budget, joint, joint_batch, actions, chunk
        )
    return _record_part(tasks, env, groups, configurations, seeds, budget, joint, joint_batch, actions)


@dataclass
class _Budget:
    """``record``'s time budget: past ``deadline`` nothing new starts, and a profiled batch starts only
    when the longest one so far (``profiles``, the drivers' rule for cell batches) would still end
    before it."""

    deadline: float | None
    profiles: BatchClock = field(default_factory=BatchClock)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def fits_a_batch(self) -> bool:
        return self.profiles.fits(self.deadline)


def _record_part(
    tasks, env, groups, configurations, seeds, budget: _Budget, joint, joint_batch, actions
) -> dict[str, Any]:
    """``record`` of ``tasks`` within ``budget``: profiles batch by batch, then actions, then the
    configurations."""
    t0 = time.monotonic()
    failures: list[dict[str, str]] = []
    failed_profile: set[str] = set()
    complete = True
    batches = (
        [
            (tasks[i : i + max(1, joint_batch)], list(groups))
            for i in range(0, len(tasks), max(1, joint_batch))
        ]
        if joint
        else [(list(tasks), [g]) for g in groups]
    )
    for done, (batch, wanted) in enumerate(batches):
        if not budget.fits_a_batch():
            complete = False
            break
        started = time.monotonic()
        for f in env.prefetch(batch, wanted):
            failed_profile.add(f["task_id"])
            failures.append(
                {"task_id": f["task_id"], "stage": f"profile:{'+'.join(wanted)}", "error": f["error"]}
            )
        budget.profiles.ran(time.monotonic() - started)
        logger.info("profiling: %d/%d batches", done + 1, len(batches))
    rewriter = env.rewriter
    cells = action_cells(tasks, rewriter, seeds, actions) if isinstance(rewriter, ActionRewriter) else []
    go_on = complete and not budget.out_of_time()  # a chunk whose profiles stopped: its actions wait too
    results = env.try_outcomes(cells, budget.deadline) if cells and go_on else []
    results = _retry_evaluator_errors(env, cells, results, budget)
    not_started = len(cells) - len(results)  # cells the budget stopped before they began
    for cell, result in zip(cells, results, strict=False):
        if isinstance(result, CellFailure) and result.kind == "not_started":
            not_started += 1  # not a failure: a resumed run evaluates it
        elif isinstance(result, CellFailure):
            complete = complete and result.kind != "evaluator_error"  # resume retries
            failures.append(
                {"task_id": cell.task.id, "stage": f"action:{cell.action}", "error": result.message[:500]}
            )
        elif line := memory_line(cell, env.memory_plans.pop(cell.key, None)):
            logger.info("  %s", line)
    config_cells = [
        env.cell(t, configuration_groups(cfg), None, seed, 0)
        for t in tasks
        if t.id not in failed_profile
        for seed in seeds
        for cfg in (configurations or {}).values()
    ]
    for cell, result in zip(
        config_cells,
        env.try_outcomes(config_cells) if go_on and not budget.out_of_time() else [],
        strict=False,
    ):
        if isinstance(result, CellFailure):
            failures.append(
                {
                    "task_id": cell.task.id,
                    "stage": f"outcome:{cell.configuration}",
                    "error": result.message[:500],
                }
            )
    env.flush()
    actions_done = list(dict.fromkeys(c.action for c in cells))
    complete = complete and not not_started and not budget.out_of_time()
    return _summary(env, tasks, groups, actions_done, failures, not_started, t0, complete)


# a short name for each ``CellFailure.cause`` (``EVALUATOR_CAUSES``), tallied in the log so that a
# recording shows which cells crowd each other out; any other evaluator failure is "other"
_WHY_FAILED = {
    CANDIDATE_CROWDED_OUT: "candidate out of memory",
    REFERENCE_CROWDED_OUT: "reference out of memory",
    NO_ROOM: "no room",
}


def _retry_evaluator_errors(
    env: Environment, cells: Sequence[Cell], results: list, budget: _Budget
) -> list[RewardRow | CellFailure]:
    """``results`` with the cells the evaluator failed (``evaluator_error``, not the candidate's fault:
    most often a candidate crowded out of GPU memory by the other evaluations in flight) evaluated again:
    first together (only they are in flight, not the whole chunk), then what still fails one at a time,
    alone on the device. What fails even alone stays a failure, evaluated again by a resumed run."""
    results = list(results)
    for alone in (False, True):
        again = [
            i for i, r in enumerate(results) if isinstance(r, CellFailure) and r.kind == "evaluator_error"
        ]
        if not again or budget.out_of_time():
            break
        logger.info(
            "evaluating %d cells again %s (the evaluator failed them: %s; %s)",
            len(again),
            "one at a time" if alone else "together",
            _tally(cells[i].action or "configuration" for i in again),
            _tally(_WHY_FAILED.get(results[i].cause, "other") for i in again),
        )
        for i in again:  # each whole (the message names the cell): an allocator's says what it held
            message = first_line(results[i].message, 2000, empty="(no message)")
            logger.info("  the evaluator failed: %s", message)
        for batch in [[i] for i in again] if alone else [again]:
            if budget.out_of_time():
                break
            for i, result in zip(
                batch, env.try_outcomes([cells[i] for i in batch], budget.deadline), strict=True
            ):
                results[i] = result
    return results


def _tally(names) -> str:
    """``b 3, a 1, c 1``: how often each name occurs, most frequent first, then by name."""
    counts = Counter(names)
    return ", ".join(f"{name} {counts[name]}" for name in sorted(counts, key=lambda k: (-counts[k], k)))


def _record_in_chunks(
    tasks, env, groups, configurations, seeds, budget: _Budget, joint, joint_batch, actions, chunk
) -> dict[str, Any]:
    """``record`` over ``chunk`` tasks at a time within one budget; one summary for all."""
    t0 = time.monotonic()
    failures: list[dict[str, str]] = []
    complete, done_actions, not_started = True, [], 0
    for i in range(0, len(tasks), chunk):
        if budget.out_of_time() or not budget.fits_a_batch():  # the chunk's first batch would not end in time
            complete = False
            break
        part = _record_part(
            tasks[i : i + chunk], env, groups, configurations, seeds, budget, joint, joint_batch, actions
        )
        span = (i + 1, min(i + chunk, len(tasks)), len(tasks))
        if part["complete"]:
            logger.info("recorded tasks %d-%d of %d", *span)
        else:
            why = [f"{len(part['failures'])} failures"] if part["failures"] else []
            why += [f"{part['not_started']} action cells not started"] if part["not_started"] else []
            why = why or ["the time budget"]
            logger.info("tasks %d-%d of %d: not all recorded (%s)", *span, "; ".join(why))
        failures += part["failures"]
        not_started += part["not_started"]
        complete = complete and part["complete"]
        done_actions = list(dict.fromkeys(done_actions + part["actions"]))
    return _summary(env, tasks, groups, done_actions, failures, not_started, t0, complete)


def memory_line(cell: Cell, plan: dict | None) -> str | None:
    """One log line comparing what a candidate's process reserved at most on the device with what the
    evaluator's memory plan gave it (``RewardRow.memory``, kept by ``Environment.memory_plans``), or
    ``None`` where the plan has no device peak (CPU, an evaluation that stopped before timing).
    ``bench/memory_crowding.py`` reads these lines."""
    if not plan or not isinstance(plan.get("candidate_peak_reserved_bytes"), int):
        return None
    cap = plan.get("candidate_cap_bytes")
    return (
        f"memory: {cell.task.id} action {cell.action!r}: the candidate reserved "
        f"{gib(plan['candidate_peak_reserved_bytes'])} GiB at most; planned "
        f"{gib(plan.get('candidate_bytes', 0))} GiB, headroom {gib(plan.get('headroom_bytes', 0))} GiB, "
        f"cap {gib(cap) + ' GiB' if cap else 'none'}, "
        f"{'beside others' if plan.get('beside_others') else 'alone'}"
    )


def _summary(env, tasks, groups, actions, failures, not_started: int, t0: float, complete: bool) -> dict:
    """``record``'s summary: counts from the environment's tables, the failures, the action cells the
    time budget stopped before they began (``not_started``: left for ``--resume``, not failures), the
    time since ``t0``."""
    rows = env.rewards.rows()
    return {
        "tasks": len(tasks),
        "groups": list(groups),
        "actions": actions,
        "profile_rows": len(env.profiles),
        "reward_rows": len(rows),
        "evaluations": env.stats.evaluations,
        "failures": failures,
        "not_started": not_started,
        "seconds": round(time.monotonic() - t0, 2),
        "complete": complete,
        "status": dict(Counter(str(r.error_kind) for r in rows)),
    }


def derive_configuration_rows(
    env: Environment,
    tasks: Sequence[Task],
    configurations: dict[str, Sequence[str]],
    into: RewardTable,
    seeds: Sequence[int] = (0,),
) -> dict[str, Any]:
    """Write into ``into`` each (task, fixed configuration) row a rule rewriter's recording implies.

    For a recording of actions only (``oracle_sweep.py evaluate_only=true``, or one made under an older
    rule version): the row is the rule's decision on the recorded profile restricted to the
    configuration, joined with the recorded evaluation of that action, keyed by the rewriter's current
    identity. Tasks lacking a recorded group or action are listed, not written; rows already present
    are kept. Returns ``{"written", "missing"}``.
    """
    cells = [
        env.cell(t, configuration_groups(cfg), None, seed, 0)
        for t in tasks
        for seed in seeds
        for cfg in configurations.values()
    ]
    names = [name for _ in tasks for _ in seeds for name in configurations]
    written, missing = 0, []
    for cell, name, result in zip(cells, names, env.try_outcomes(cells), strict=True):
        if isinstance(result, CellFailure):
            missing.append({"task_id": cell.task.id, "configuration": name, "error": result.message[:300]})
        else:
            written += bool(into.append(result))
    into.flush()
    return {"written": written, "missing": missing}
