"""Judging policies: per-task outcomes, KernelBench-style summaries, the oracle sweep, refinement.

Everything here takes an environment (``autoprofiler.environments``) and returns plain rows (dicts), so
the same code runs on a live GPU run and on a replay table, and ``report.py`` can draw from the rows.

- ``split_tasks``: a train/test split fixed by a hash of each task id (a task never changes side).
- ``evaluate_policies``: per (policy, task) outcome rows and per policy (and per tier) summaries:
  geomean effective speedup, execution accuracy, fast_p for p in 0, 1, 1.5, 2 (KernelBench: the
  fraction of *all* tasks that are correct and have speedup > p), mean reward, passes and profiling
  seconds per task, LLM calls per task, and the count of unanswerable cells.
- ``oracle_analysis``: the paper's Figure 2 / Table 6: each fixed configuration's outcome per task, the
  best static configuration, the per-task oracle, wins per configuration, and a bootstrap 95% CI of the
  oracle's relative gain over the best static configuration.
- ``refine``: iterative refinement: round r+1 profiles the best kernel so far, routes it, rewrites once
  more; speedup against cumulative time per task.

Example::

    env = ReplayEnvironment.from_dir("datasets/h200_suite", rewriter=RuleRewriter())
    rows, summary = evaluate_policies(test_tasks, {"blind": Blind(), "tree": TreePolicy(tree)}, env)
    summary["tree"]["geomean_speedup"], summary["tree"]["fast_1"]
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autoprofiler import rewards
from autoprofiler.cells import Cell, CellFailure, RewardRow
from autoprofiler.environments import Environment, MissingOutcome, MissingProfile
from autoprofiler.tasks import Task, refinement_task

__all__ = [
    "FAST_P",
    "evaluate_policies",
    "geomean",
    "oracle_analysis",
    "outcome_matrix",
    "refine",
    "split_tasks",
    "summarize",
]

logger = logging.getLogger(__name__)

FAST_P = (0.0, 1.0, 1.5, 2.0)
UNANSWERABLE = (MissingOutcome, MissingProfile)


def split_tasks(
    tasks: Sequence[Task], test_fraction: float = 0.3, salt: str = "autoprofiler-split-v1"
) -> tuple[list[Task], list[Task]]:
    """(train, test): a task is in test when sha256(salt + id) maps below ``test_fraction``.

    Fixed by the id alone, so adding tasks never moves an existing one across the split.

    >>> from autoprofiler.tasks import Task
    >>> ts = [Task.from_source(f"t{i}", f"# {i}") for i in range(100)]
    >>> train, test = split_tasks(ts)
    >>> len(train) + len(test), 15 < len(test) < 45
    (100, True)
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction: expected a number in [0, 1], got {test_fraction!r}")
    train, test = [], []
    for t in tasks:
        u = int(hashlib.sha256((salt + t.id).encode()).hexdigest()[:12], 16) / float(16**12)
        (test if u < test_fraction else train).append(t)
    return train, test


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (1.0 for none).

    >>> round(geomean([1.0, 4.0]), 6)
    2.0
    """
    vals = [float(v) for v in values]
    if not vals:
        return 1.0
    return math.exp(sum(math.log(max(v, 1e-12)) for v in vals) / len(vals))


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """KernelBench-style numbers over outcome rows (missing rows count as not correct, speedup 1.0)."""
    n = len(rows)
    if n == 0:
        return {"tasks": 0}
    answered = [r for r in rows if not r.get("missing")]
    eff = [r["effective_speedup"] if not r.get("missing") else 1.0 for r in rows]
    correct = [bool(r.get("correct")) and not r.get("missing") for r in rows]
    speed = [r.get("speedup") or 0.0 for r in rows]
    out = {
        "tasks": n,
        "answered": len(answered),
        "missing": n - len(answered),
        "geomean_speedup": geomean(eff),
        "mean_speedup": sum(eff) / n,
        "accuracy": sum(correct) / n,
        "mean_reward": sum(r.get("reward") or 0.0 for r in answered) / n,
        "passes_per_task": sum(r.get("passes") or 0 for r in rows) / n,
        "profile_seconds_per_task": sum(r.get("profile_seconds") or 0.0 for r in rows) / n,
        "llm_calls_per_task": sum(r.get("llm_calls") or 0 for r in rows) / n,
    }
    for p in FAST_P:
        out[f"fast_{p:g}"] = sum(1 for c, s in zip(correct, speed, strict=True) if c and s > p) / n
    return out


def _cost(env: Environment, task: Task, groups: Iterable[str]) -> tuple[int, float]:
    try:
        return env.group_cost(task, groups)
    except UNANSWERABLE:
        return 0, 0.0


def evaluate_policies(
    tasks: Sequence[Task],
    policies: Mapping[str, Any],
    env: Environment,
    rewriter: Any = None,
    seeds: Sequence[int] = (0,),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run each policy on each task through ``env``; returns (rows, summary).

    A policy is a ``Policy`` (``select(task, profiler) -> Selection``: Blind, Static, Random,
    TreePolicy, ...), or an oracle: a mapping name -> groups (or an ``Oracle`` policy), which takes per
    task the configuration with the highest reward and pays for profiling all of them (analysis only).

    Every policy first selects for every task (routing on the environment's profiles); then the cells
    of all (policy, task, seed) go to the environment in one ``try_outcomes`` call, so a live
    environment's workers evaluate them in parallel.

    Each row: policy, task_id, level, seed, configuration, leaf, action, correct, speedup,
    effective_speedup, reward, passes, profile_seconds, llm_calls, missing (the reason when the
    environment cannot answer the cell). ``summary[policy]`` holds ``summarize`` of its rows plus
    ``by_level``.
    """
    plans: list[tuple[dict[str, Any], list[tuple[str, Cell]]]] = []
    for name, policy in policies.items():
        configs = _oracle_configs(policy)
        for task in tasks:
            for seed in seeds:
                row = _base_row(name, task, seed)
                if configs is not None:
                    cells = [(c, env.cell(task, g, rewriter, seed)) for c, g in configs.items()]
                    row["passes"], row["profile_seconds"] = _cost(
                        env, task, {g for c in configs.values() for g in c}
                    )
                else:
                    cells = _select(row, policy, task, env, rewriter, seed)
                plans.append((row, cells))
    cells = [cell for _, pairs in plans for _, cell in pairs]
    results = dict(zip([c.key for c in cells], env.try_outcomes(cells), strict=True)) if cells else {}
    rows = []
    for row, pairs in plans:
        outcomes = [(label, results[cell.key]) for label, cell in pairs]
        missing = [r for _, r in outcomes if isinstance(r, CellFailure)]
        if missing:
            row["missing"] = missing[0].message
        elif outcomes:
            label, best = max(outcomes, key=lambda lr: (lr[1].reward, lr[1].effective_speedup))
            if len(outcomes) > 1:  # an oracle: the leaf names the configuration it took
                row["leaf"] = label
            row["configuration"] = best.configuration
            _fill(row, best)
        rows.append(row)
    summary: dict[str, Any] = {}
    for name in policies:
        mine = [r for r in rows if r["policy"] == name]
        summary[name] = summarize(mine)
        summary[name]["by_level"] = {
            lvl: summarize([r for r in mine if r["level"] == lvl])
            for lvl in sorted({r["level"] for r in mine})
        }
    return rows, summary


def _select(row: dict[str, Any], policy: Any, task: Task, env: Environment, rewriter: Any, seed: int):
    """The policy's selection for ``task`` (its cost and leaf into ``row``); [(leaf, cell)] or []."""
    env.profiler.reset()  # each (policy, task) pays for its own profiling
    try:
        sel = policy.select(task, env.profiler)
    except UNANSWERABLE as e:
        row["missing"] = str(e)
        return []
    collected = sorted(sel.profile.groups) if sel.profile is not None else []
    row["configuration"], row["leaf"] = rewards.configuration_name(sel.groups), sel.leaf
    row["passes"], row["profile_seconds"] = _cost(env, task, collected)
    return [(sel.leaf, env.cell(task, sel.groups, rewriter, seed, policy=row["policy"]))]


def _oracle_configs(policy: Any) -> dict[str, tuple[str, ...]] | None:
    from autoprofiler.policies import Oracle

    if isinstance(policy, Mapping):
        return {k: tuple(v) for k, v in policy.items()}
    if isinstance(policy, Oracle):
        return {k: tuple(v) for k, v in policy.configurations.items()}
    return None


def _base_row(name: str, task: Task, seed: int) -> dict[str, Any]:
    return {
        "policy": name,
        "task_id": task.id,
        "task_hash": task.hash,
        "level": int(task.level),
        "seed": seed,
        "configuration": None,
        "leaf": None,
        "action": None,
        "correct": False,
        "speedup": None,
        "effective_speedup": 1.0,
        "reward": 0.0,
        "passes": 0,
        "profile_seconds": 0.0,
        "llm_calls": 0,
        "missing": "",
    }


def _fill(row: dict[str, Any], outcome: RewardRow) -> dict[str, Any]:
    row.update(
        action=outcome.action,
        correct=bool(outcome.correct),
        speedup=outcome.speedup,
        effective_speedup=outcome.effective_speedup,
        reward=outcome.reward,
        llm_calls=int(outcome.llm_calls or 0),
        error_kind=outcome.error_kind,
    )
    return row


# --- the oracle sweep --------------------------------------------------------------------------------
def outcome_matrix(
    tasks: Sequence[Task],
    configurations: Mapping[str, Sequence[str]],
    env: Environment,
    rewriter: Any = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (task, named configuration): the environment's outcome (or ``missing`` with why).

    Every cell goes to the environment in one call.
    """
    pairs = [
        (task, name, env.cell(task, groups, rewriter, seed, policy=f"static:{name}"))
        for task in tasks
        for name, groups in configurations.items()
    ]
    results = env.try_outcomes([cell for _, _, cell in pairs]) if pairs else []
    out = []
    for (task, name, cell), o in zip(pairs, results, strict=True):
        base = {
            "task_id": task.id,
            "task_hash": task.hash,
            "level": int(task.level),
            "config_name": name,
            "configuration": cell.configuration,
        }
        if isinstance(o, CellFailure):
            out.append({**base, "missing": o.message})
            continue
        out.append(
            {
                **base,
                "action": o.action,
                "correct": bool(o.correct),
                "speedup": o.speedup,
                "effective_speedup": o.effective_speedup,
                "reward": o.reward,
                "missing": "",
            }
        )
    return out


def oracle_analysis(
    matrix: Sequence[Mapping[str, Any]], bootstrap: int = 2000, seed: int = 0, confidence: float = 0.95
) -> dict[str, Any]:
    """The paper's Figure 2 / Table 6 from ``outcome_matrix`` rows.

    Only tasks answered for every configuration are used. Per configuration: geomean effective speedup,
    accuracy, wins (tasks where it is strictly the best by effective speedup; ties are counted apart).
    Best static: the configuration with the highest geomean. Oracle: per task the best configuration.
    ``relative_gain``: oracle geomean / best-static geomean, with a bootstrap CI over tasks (the best
    static configuration re-chosen in every resample, so selection is part of the uncertainty).
    """
    import numpy as np

    names = list(dict.fromkeys(r["config_name"] for r in matrix))
    by_task: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in matrix:
        by_task.setdefault(r["task_id"], {})[r["config_name"]] = r
    complete = [t for t, d in by_task.items() if all(n in d and not d[n].get("missing") for n in names)]
    skipped = sorted(set(by_task) - set(complete))
    if not complete or not names:
        return {"tasks": 0, "skipped": skipped, "configurations": names}
    eff = np.array([[float(by_task[t][n]["effective_speedup"]) for n in names] for t in complete])
    logs = np.log(np.maximum(eff, 1e-12))
    per_config = {}
    best_per_task = logs.max(axis=1)
    for j, n in enumerate(names):
        strict = (logs[:, j] == best_per_task) & ((logs == best_per_task[:, None]).sum(axis=1) == 1)
        per_config[n] = {
            "geomean_speedup": float(np.exp(logs[:, j].mean())),
            "accuracy": float(np.mean([bool(by_task[t][n].get("correct")) for t in complete])),
            "wins": int(strict.sum()),
        }
    ties = int(((logs == best_per_task[:, None]).sum(axis=1) > 1).sum())
    best = max(names, key=lambda n: per_config[n]["geomean_speedup"])
    oracle = float(np.exp(best_per_task.mean()))
    gain = oracle / per_config[best]["geomean_speedup"]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(complete), size=(bootstrap, len(complete)))
    sample_logs = logs[idx]  # (B, n, k)
    gains = np.exp(sample_logs.max(axis=2).mean(axis=1) - sample_logs.mean(axis=1).max(axis=1))
    lo, hi = np.quantile(gains, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    per_task = [
        {
            "task_id": t,
            **{n: float(eff[i, j]) for j, n in enumerate(names)},
            "best": [n for j, n in enumerate(names) if logs[i, j] == best_per_task[i]],
        }
        for i, t in enumerate(complete)
    ]
    return {
        "tasks": len(complete),
        "skipped": skipped,
        "configurations": names,
        "per_configuration": per_config,
        "ties": ties,
        "best_static": best,
        "best_static_geomean": per_config[best]["geomean_speedup"],
        "oracle_geomean": oracle,
        "relative_gain": gain,
        "relative_gain_ci": [float(lo), float(hi)],
        "confidence": confidence,
        "bootstrap": bootstrap,
        "per_task": per_task,
    }


# --- iterative refinement ----------------------------------------------------------------------------
def refine(
    tasks: Sequence[Task], policy: Any, env: Environment, rounds: int, rewriter: Any = None, seed: int = 0
) -> list[dict[str, Any]]:
    """Iterative refinement: per task, ``rounds`` rounds of profile -> route -> rewrite -> evaluate.

    Round 0 optimizes the task; round r+1 optimizes the best program so far (``refinement_task``: the
    best correct, faster candidate becomes the reference), so its speedup is over the previous best and
    the speedup over the original is the product. A round the environment cannot answer (a replay
    without recorded rounds > 0) ends that task's curve with ``missing`` set.

    Returns one row per (task, round): round, configuration, action, round_speedup, cumulative_speedup,
    cumulative_seconds (profiling + evaluation + nothing for the LLM's wall time, which the tables do not
    hold), cumulative_llm_calls, missing.
    """
    out = []
    for task in tasks:
        current, cumulative, seconds, calls = task, 1.0, 0.0, 0
        for r in range(rounds):
            row = {
                "task_id": task.id,
                "level": int(task.level),
                "round": r,
                "configuration": None,
                "action": None,
                "round_speedup": None,
                "missing": "",
            }
            try:
                env.profiler.reset()
                sel = policy.select(current, env.profiler)
                config = rewards.configuration_name(sel.groups)
                collected = sorted(sel.profile.groups) if sel.profile is not None else []
                o = env.outcome(current, config, rewriter, seed, r)
            except UNANSWERABLE as e:
                row.update(
                    missing=str(e),
                    cumulative_speedup=cumulative,
                    cumulative_seconds=seconds,
                    cumulative_llm_calls=calls,
                )
                out.append(row)
                break
            seconds += _cost(env, current, collected)[1] + float(o.eval_seconds or 0.0)
            calls += int(o.llm_calls or 0)
            improved = bool(o.correct) and (o.speedup or 0.0) > 1.0
            if improved:
                cumulative *= float(o.speedup)
                source = env.candidate_source(o.candidate_hash) if o.candidate_hash else None
                if source is not None:
                    current = refinement_task(task, source, r + 1)
            row.update(
                configuration=config,
                action=o.action,
                round_speedup=o.speedup,
                correct=bool(o.correct),
                cumulative_speedup=cumulative,
                cumulative_seconds=seconds,
                cumulative_llm_calls=calls,
            )
            out.append(row)
    return out
