"""Judging policies: per-task outcomes, KernelBench-style summaries, the oracle sweep, refinement.

Everything here takes an environment (``autoprofiler.environments``) and returns plain rows (dicts), so
the same code runs on a live GPU run and on a replay table, and ``autoprofiler.report`` can draw from the
rows.
Every summary over rows is a polars aggregation (``summary_frame``, ``oracle_analysis``), and reward
and profile tables are read as polars frames (``reward_frame``, ``profile_frame``).

- ``split_tasks``: a train/test split fixed by a hash of each task id (a task never changes side).
- ``evaluate_policies``: per (policy, task) outcome rows and per policy (and per tier, per card) summaries:
  geomean effective speedup, execution accuracy, fast_p for p in 0, 1, 1.5, 2 (KernelBench: the
  fraction of *all* tasks that are correct and have speedup > p), mean reward, passes and profiling
  seconds per task, LLM calls per task, and the count of unanswerable cells.
- ``oracle_analysis``: the paper's Figure 2 / Table 6: each fixed configuration's outcome per task, the
  best static configuration, the per-task oracle, wins per configuration, and a bootstrap 95% CI of the
  oracle's relative gain over the best static configuration.
- ``summary_frame`` / ``summarize``: the KernelBench-style numbers above as one polars aggregation, over
  a frame of outcome rows (``outcome_frame``), optionally grouped (per policy, per level, ...).
- ``paired_ratio`` / ``beats``: one policy's geomean over another's on the same tasks with a paired
  bootstrap interval, and the verdict it supports (a workflow says "beats" only when the interval is
  above 1, not on a point estimate that task sampling can flip).
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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import polars as pl

from autoprofiler import rewards
from autoprofiler.cells import Cell, CellFailure, RewardRow
from autoprofiler.environments import Environment, MissingOutcome, MissingProfile
from autoprofiler.heldout import Interval, paired_difference
from autoprofiler.tables import read_table
from autoprofiler.tasks import Task, refinement_task

__all__ = [
    "FAST_P",
    "beats",
    "evaluate_policies",
    "geomean",
    "geomean_expr",
    "oracle_analysis",
    "outcome_frame",
    "outcome_matrix",
    "paired_ratio",
    "profile_frame",
    "ratio_text",
    "refine",
    "reward_frame",
    "split_tasks",
    "summarize",
    "summary_frame",
]

logger = logging.getLogger(__name__)

FAST_P = (0.0, 1.0, 1.5, 2.0)
_FLOOR = 1e-12  # speedups are clipped here before the log
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


def geomean_expr(column: str | pl.Expr) -> pl.Expr:
    """A polars expression: the geometric mean of ``column`` (values below 1e-12 count as 1e-12).

    The one geomean of the project: ``exp(mean(log(max(v, 1e-12))))``; null values are left out.

    >>> pl.DataFrame({"v": [1.0, 4.0]}).select(geomean_expr("v")).item()
    2.0
    """
    expr = pl.col(column) if isinstance(column, str) else column
    return expr.cast(pl.Float64).clip(lower_bound=_FLOOR).log().mean().exp()


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values (1.0 for none); ``geomean_expr`` over a list.

    >>> round(geomean([1.0, 4.0]), 6)
    2.0
    """
    series = pl.Series("v", [float(v) for v in values], dtype=pl.Float64)
    if series.is_empty():
        return 1.0
    return float(series.to_frame().select(geomean_expr("v")).item())


#: Outcome-row columns a summary reads, with their types (absent or ``None`` values are null).
OUTCOME_COLUMNS: dict[str, pl.DataType] = {
    "effective_speedup": pl.Float64(),
    "correct": pl.Boolean(),
    "speedup": pl.Float64(),
    "reward": pl.Float64(),
    "passes": pl.Int64(),
    "profile_seconds": pl.Float64(),
    "llm_calls": pl.Int64(),
}


def outcome_frame(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = ()) -> pl.DataFrame:
    """Outcome rows (``evaluate_policies``' rows, ``cli`` summary rows, ...) as a typed polars frame.

    Columns: ``keys`` as given (e.g. ``policy``, ``level``: what ``summary_frame`` groups by), then
    ``missing`` (True when the row carries a non-empty ``missing`` reason) and ``OUTCOME_COLUMNS``.
    A row may lack any of them (``{"correct": True, "speedup": 2.0, ...}`` is enough).
    """
    data: dict[str, pl.Series] = {k: pl.Series(k, [r.get(k) for r in rows]) for k in keys}
    data["missing"] = pl.Series("missing", [bool(r.get("missing")) for r in rows], dtype=pl.Boolean)
    for name, dtype in OUTCOME_COLUMNS.items():
        values = [r.get(name) for r in rows]
        if name == "correct":
            values = [None if v is None else bool(v) for v in values]
        data[name] = pl.Series(name, values, dtype=dtype, strict=False)
    return pl.DataFrame(data)


def effective_expr() -> pl.Expr:
    """An ``outcome_frame``'s effective speedup as the summaries count it: 1.0 for a missing row (the
    original kept), the row's own value otherwise."""
    return pl.when(~pl.col("missing")).then(pl.col("effective_speedup")).otherwise(1.0)


def _summary_exprs() -> list[pl.Expr]:
    """The KernelBench-style numbers, in ``summarize``'s key order (see ``summarize``)."""
    answered = ~pl.col("missing")
    correct = pl.col("correct").fill_null(False) & answered
    effective = effective_expr()
    speed = pl.col("speedup").fill_null(0.0)
    return [  # a mean over all rows of the group is a sum divided by the tasks
        pl.len().cast(pl.Int64).alias("tasks"),
        answered.sum().cast(pl.Int64).alias("answered"),
        pl.col("missing").sum().cast(pl.Int64).alias("missing"),
        geomean_expr(effective).alias("geomean_speedup"),
        effective.mean().alias("mean_speedup"),
        correct.mean().alias("accuracy"),
        pl.when(answered).then(pl.col("reward").fill_null(0.0)).otherwise(0.0).mean().alias("mean_reward"),
        pl.col("passes").fill_null(0).mean().alias("passes_per_task"),
        pl.col("profile_seconds").fill_null(0.0).mean().alias("profile_seconds_per_task"),
        pl.col("llm_calls").fill_null(0).mean().alias("llm_calls_per_task"),
        *[(correct & (speed > p)).mean().alias(f"fast_{p:g}") for p in FAST_P],
    ]


def summary_frame(frame: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """``summarize``'s numbers for an ``outcome_frame``: one row, or one row per ``by`` group.

    Groups keep the order in which they first appear in ``frame``.
    """
    if by:
        return frame.group_by(list(by), maintain_order=True).agg(_summary_exprs())
    return frame.select(_summary_exprs())


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """KernelBench-style numbers over outcome rows (missing rows count as not correct, speedup 1.0).

    Returns tasks, answered, missing, geomean_speedup (of effective speedups), mean_speedup, accuracy,
    mean_reward (a missing row counts 0), passes / profile_seconds / llm_calls per task, and fast_p for
    p in ``FAST_P``: the fraction of all rows that are correct with speedup > p. ``{"tasks": 0}`` for
    no rows.

    >>> s = summarize([{"correct": True, "speedup": 4.0, "effective_speedup": 4.0}, {"missing": "why"}])
    >>> s["geomean_speedup"], s["accuracy"], s["fast_1"], s["missing"]
    (2.0, 0.5, 0.5, 1)
    """
    if not rows:
        return {"tasks": 0}
    return summary_frame(outcome_frame(rows)).row(0, named=True)


def paired_ratio(
    rows: Sequence[Mapping[str, Any]],
    policy: str,
    baseline: str,
    samples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval:
    """``policy``'s geomean effective speedup over ``baseline``'s on the same tasks, with a paired
    percentile bootstrap interval (tasks resampled with replacement).

    Per task, the mean log effective speedup over its rows (seeds), counted as ``summarize`` counts it
    (``effective_expr``: a missing row is 1.0), so with one row per task the estimate is the ratio of the
    two policies' summary geomeans. An answered row without a value, which ``summarize`` leaves out,
    counts 1.0 here so that every task stays paired.

    Raises:
        ValueError: a policy without rows, or the two policies' rows covering different tasks.

    >>> rows = [{"policy": p, "task_hash": t, "effective_speedup": s}
    ...         for p, t, s in [("a", "x", 2.0), ("a", "y", 1.0), ("b", "x", 1.0), ("b", "y", 1.0)]]
    >>> r = paired_ratio(rows, "a", "b")
    >>> round(r.estimate, 4), r.n, beats(r)
    (1.4142, 2, False)
    """
    frame = outcome_frame(rows, keys=("policy", "task_hash")).with_columns(
        effective_expr().fill_null(1.0).clip(lower_bound=_FLOOR).log().alias("log_eff")
    )
    per_task = {}
    for name in (policy, baseline):
        part = frame.filter(pl.col("policy") == name)
        if part.is_empty():
            raise ValueError(f"paired_ratio: no rows of policy {name!r}")
        per_task[name] = dict(part.group_by("task_hash").agg(pl.col("log_eff").mean()).iter_rows())
    if per_task[policy].keys() != per_task[baseline].keys():
        only = sorted(per_task[policy].keys() ^ per_task[baseline].keys())
        raise ValueError(
            f"paired_ratio: {policy!r} and {baseline!r} cover different tasks ({len(only)} in one only, "
            f"e.g. {only[0]})"
        )
    tasks = sorted(per_task[policy])
    mine, theirs = ([per_task[name][t] for t in tasks] for name in (policy, baseline))
    return paired_difference(mine, theirs, samples, seed, confidence).exp()


def beats(ratio: Interval) -> bool:
    """Whether a ``paired_ratio`` supports "beats": its whole interval is above 1."""
    return ratio.low > 1.0


def ratio_text(ratio: Interval) -> str:
    """A ``paired_ratio`` as text, e.g. ``0.933 [0.894, 0.968] over 162 tasks``, then where it stands
    against 1 (above, below, or holding 1)."""
    where = "above 1" if beats(ratio) else ("below 1" if ratio.high < 1.0 else "the interval holds 1")
    return (
        f"{ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] over {ratio.n} tasks "
        f"({ratio.confidence:.0%} paired bootstrap; {where})"
    )


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

    Each row: policy, task_id, level, seed, device, configuration, leaf, action, correct, speedup,
    effective_speedup, reward, passes, profile_seconds, llm_calls, missing (the reason when the
    environment cannot answer the cell). ``device`` is the task's card (``task_devices``), the same in
    every policy's row of the task, so per-card numbers compare policies on the same tasks.
    ``summary[policy]`` holds ``summarize`` of its rows plus ``by_level`` and ``by_device``.
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
    devices = task_devices(rows)
    for row in rows:
        row["device"] = devices[row["task_hash"]]
    return rows, _policy_summaries(rows, list(policies))


def task_devices(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Task hash -> the card its answered rows were measured on: the one device they name, ``"mixed"``
    when they name several (a live run over a cluster of unlike GPUs), ``"unanswered"`` when none.
    A row's ``device`` is its outcome's until ``evaluate_policies`` replaces it with the task's."""
    seen: dict[str, set[str]] = {}
    for row in rows:
        names = seen.setdefault(row["task_hash"], set())
        if row.get("device"):
            names.add(row["device"])

    def card(names: set[str]) -> str:
        return next(iter(names)) if len(names) == 1 else ("mixed" if names else "unanswered")

    return {task_hash: card(names) for task_hash, names in seen.items()}


def _policy_summaries(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """``summarize`` per policy, with ``by_level`` and ``by_device``: the same numbers per task level
    (ascending) and per card (by name)."""
    frame = outcome_frame(rows, keys=("policy", "level", "device"))
    overall = {s.pop("policy"): s for s in summary_frame(frame, ["policy"]).to_dicts()}
    parts: dict[str, dict[str, dict[Any, dict[str, Any]]]] = {"by_level": {}, "by_device": {}}
    for part, key in (("by_level", "level"), ("by_device", "device")):
        for s in summary_frame(frame, ["policy", key]).sort(key, maintain_order=True).to_dicts():
            parts[part].setdefault(s.pop("policy"), {})[s.pop(key)] = s
    return {
        name: {**overall.get(name, {"tasks": 0}), **{part: by.get(name, {}) for part, by in parts.items()}}
        for name in names
    }


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
        "device": None,
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
        device=outcome.device or None,
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
    matrix: pl.DataFrame | Sequence[Mapping[str, Any]],
    bootstrap: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The paper's Figure 2 / Table 6 from ``outcome_matrix`` rows (or a frame of them).

    Reads task_id, config_name, effective_speedup, correct and missing; a (task, configuration) given
    twice counts its last row. Only tasks answered for every configuration are used (``skipped``: the
    others). Per configuration: geomean effective speedup, accuracy, wins (tasks where it is strictly the
    best by effective speedup; ``ties``: tasks where several share the best). Best static: the
    configuration with the highest geomean (the first listed on a tie). Oracle: per task the best
    configuration. ``relative_gain``: oracle geomean / best-static geomean, with a bootstrap CI over
    tasks (the best static configuration re-chosen in every resample, so selection is part of the
    uncertainty). Configurations and tasks keep the order in which they first appear.
    """
    import numpy as np

    frame = _matrix_frame(matrix)
    names = frame["config_name"].unique(maintain_order=True).to_list()
    cells = frame.unique(["task_id", "config_name"], keep="last", maintain_order=True)
    answered = cells.filter(~pl.col("missing"))
    order = frame.select(pl.col("task_id").unique(maintain_order=True)).with_row_index("order")
    complete = (
        answered.group_by("task_id")
        .len()
        .filter(pl.col("len") == len(names))
        .join(order, on="task_id")
        .sort("order")["task_id"]
        .to_list()
    )
    skipped = sorted(set(order["task_id"].to_list()) - set(complete))
    if not complete or not names:
        return {"tasks": 0, "skipped": skipped, "configurations": names}
    long = answered.filter(pl.col("task_id").is_in(complete)).with_columns(
        log=pl.col("effective_speedup").clip(lower_bound=_FLOOR).log()
    )
    is_best = pl.col("log") == pl.col("log").max().over("task_id")
    long = long.with_columns(best=is_best, sharing=is_best.sum().over("task_id"))
    stats = long.group_by("config_name").agg(
        geomean_speedup=pl.col("log").mean().exp(),
        accuracy=pl.col("correct").fill_null(False).cast(pl.Float64).mean(),
        wins=(pl.col("best") & (pl.col("sharing") == 1)).sum().cast(pl.Int64),
    )
    per_config = {s.pop("config_name"): s for s in stats.to_dicts()}
    per_config = {n: per_config[n] for n in names}
    ties = long.filter(pl.col("best") & (pl.col("sharing") > 1))["task_id"].n_unique()
    oracle = long.filter(pl.col("best")).group_by("task_id").agg(pl.col("log").first())["log"].mean()
    oracle = float(np.exp(oracle))
    best = max(names, key=lambda n: per_config[n]["geomean_speedup"])
    gain = oracle / per_config[best]["geomean_speedup"]

    # the task x configuration matrix (tasks in first-appearance order) for the bootstrap
    wide = (
        long.pivot(on="config_name", index="task_id", values="effective_speedup")
        .join(order, on="task_id")
        .sort("order")
    )
    eff = wide.select(names).to_numpy()
    logs = np.log(np.maximum(eff, _FLOOR))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(complete), size=(bootstrap, len(complete)))
    gains = np.concatenate([_bootstrap_gains(logs[idx[i : i + _CHUNK]]) for i in range(0, bootstrap, _CHUNK)])
    lo, hi = np.quantile(gains, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    best_per_task = logs.max(axis=1)
    per_task = [
        {
            "task_id": t,
            **{n: float(eff[i, j]) for j, n in enumerate(names)},
            "best": [n for j, n in enumerate(names) if logs[i, j] == best_per_task[i]],
        }
        for i, t in enumerate(wide["task_id"].to_list())
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


#: bootstrap resamples gathered at a time: all of them at once is a (B, tasks, configurations) array,
#: 380 MB for 2000 resamples of 6,000 tasks and 4 configurations
_CHUNK = 100


def _bootstrap_gains(sample_logs: Any) -> Any:
    """Per resample (rows of ``sample_logs``, shape (b, tasks, configurations)): oracle geomean over the
    best static configuration's geomean of that resample."""
    import numpy as np

    return np.exp(sample_logs.max(axis=2).mean(axis=1) - sample_logs.mean(axis=1).max(axis=1))


def _matrix_frame(matrix: pl.DataFrame | Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """task_id, config_name, effective_speedup, correct and missing (True when a reason is given)."""
    columns = {
        "task_id": pl.String,
        "config_name": pl.String,
        "effective_speedup": pl.Float64,
        "correct": pl.Boolean,
        "missing": pl.String,  # why the cell has no outcome ("" or null: answered); or a bool column
    }
    if not isinstance(matrix, pl.DataFrame):
        matrix = pl.DataFrame(
            {c: pl.Series(c, [r.get(c) for r in matrix], dtype=t, strict=False) for c, t in columns.items()}
        )
    missing = pl.col("missing")
    if matrix.schema["missing"] != pl.Boolean:  # a reason string: missing when non-empty
        missing = missing.cast(pl.String).fill_null("") != ""
    return matrix.select(
        pl.col("task_id", "config_name").cast(pl.String),
        pl.col("effective_speedup").cast(pl.Float64),
        pl.col("correct").cast(pl.Boolean).fill_null(False),
        missing.fill_null(False).alias("missing"),
    )


# --- tables as polars frames ---------------------------------------------------------------------------
def reward_frame(table_dir: str | Path) -> pl.DataFrame:
    """The reward table in ``table_dir`` (e.g. ``datasets/h200_suite/rewards``) as a polars frame.

    Read through ``tables.read_table`` (every part's schema version checked, older parts upgraded, each
    key once), so the columns are ``rewards.REWARD_SCHEMA``'s.

    Raises:
        FileNotFoundError: ``table_dir`` is not a directory.
        tables.TableSchemaError: a part of another table or of a newer schema.
    """
    return _table_frame(table_dir, "reward")


def profile_frame(table_dir: str | Path) -> pl.DataFrame:
    """The profile table in ``table_dir`` (e.g. ``datasets/h200_suite/profiles``), like ``reward_frame``."""
    return _table_frame(table_dir, "profile")


def _table_frame(table_dir: str | Path, name: str) -> pl.DataFrame:
    table_dir = Path(table_dir)
    if not table_dir.is_dir():
        raise FileNotFoundError(f"expected a {name} table directory at {table_dir}; it is not there")
    return cast(pl.DataFrame, pl.from_arrow(read_table(table_dir, name)))  # a Table gives a frame


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
