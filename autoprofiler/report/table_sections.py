"""Report sections from a recording's reward (and profile) tables: what was recorded, the rule actions
and the best action per task, the oracle sweep over the fixed configurations, rounds > 0."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from autoprofiler.analysis import geomean_expr, oracle_analysis
from autoprofiler.report.markdown import _joined, _n, _slug, markdown_table
from autoprofiler.report.plots import _bars


def _recorded_section(rewards: pl.DataFrame, profiles: pl.DataFrame | None) -> list[str]:
    per_run = rewards.group_by("run_id").len().sort("run_id")
    by_kind = rewards.group_by("rewriter", "kind").len().sort("rewriter", "kind")
    facts = rewards.select(
        pl.len().alias("reward rows"),
        pl.col("task_hash").n_unique().alias("tasks"),
        _joined("device").alias("devices"),
        _joined("round").alias("rounds"),
        _joined("seed").alias("seeds"),
    ).row(0, named=True)
    runs = [f"{r or '?'} ({_n(n, 'row')})" for r, n in per_run.head(5).rows()]
    more = f", and {per_run.height - 5} more" if per_run.height > 5 else ""
    facts["runs"] = f"{per_run.height}: {', '.join(runs)}{more}"
    facts["rows per rewriter and kind"] = ", ".join(f"{r} {k} {n}" for r, k, n in by_kind.rows())
    if profiles is not None:
        facts["profile rows (task x group)"] = profiles.height
        facts["profile groups"] = profiles.select(_joined("group")).item() if profiles.height else "-"
    table = pl.DataFrame({"what": list(facts), "value": [str(v) for v in facts.values()]})
    return ["## Recorded data\n", markdown_table(table)]


def best_action_per_task(actions: pl.DataFrame) -> pl.DataFrame:
    """Per task (``task_hash``): ``best``, the highest effective speedup over the actions recorded for it
    (an action without a row for the task is not counted), ``actions`` recorded and ``top``, the actions
    that reach ``best``. A (task, action) cell of several rows (seeds) counts by their geomean.

    Columns of ``actions``: task_hash, action, effective_speedup.
    """
    cells = actions.group_by("task_hash", "action").agg(geomean_expr("effective_speedup").alias("eff"))
    return (
        cells.with_columns(best=pl.col("eff").max().over("task_hash"))
        .group_by("task_hash")
        .agg(
            pl.col("best").first(),
            pl.len().alias("actions"),
            pl.col("action").filter(pl.col("eff") == pl.col("best")).sort().alias("top"),
        )
        .sort("task_hash")
    )


def _actions_section(actions: pl.DataFrame, rewriter: str, out: Path) -> list[str]:
    """One rewriter's rule-action rows (round 0): per action, then the best action per task.

    The best action per task takes, for each task, the best of the actions recorded for it; on the tasks
    of any one action it is at least that action's geomean (the table's last column), so the bound is
    never below a single action compared on the same tasks.
    """
    correct = pl.col("correct").fill_null(False)
    errors = (
        actions.filter(pl.col("error_kind").fill_null("") != "")
        .group_by("action", "error_kind")
        .len()
        .sort(["action", "len", "error_kind"], descending=[False, True, False])
        .group_by("action", maintain_order=True)
        .agg(pl.format("{} {}", "error_kind", "len").str.join(", ").alias("errors"))
    )
    cells = actions.group_by("task_hash", "action").agg(geomean_expr("effective_speedup").alias("eff"))
    per_task = best_action_per_task(actions)
    same_tasks = (
        cells.join(per_task.select("task_hash", "best"), on="task_hash")
        .group_by("action")
        .agg(geomean_expr("best").alias("best per task, same tasks"))
    )
    per_action = (
        actions.group_by("action")
        .agg(
            pl.col("task_hash").n_unique().alias("tasks"),
            pl.len().alias("rows"),
            correct.mean().alias("accuracy"),
            geomean_expr("effective_speedup").alias("geomean speedup"),
            (correct & (pl.col("speedup").fill_null(0.0) > 1.0)).mean().alias("fast_1"),
        )
        .join(errors, on="action", how="left")
        .with_columns(pl.col("errors").fill_null("-"))
        .join(same_tasks, on="action", how="left")
        .sort("action")
    )
    n_actions, n_tasks = per_action.height, per_task.height
    complete = per_task.filter(pl.col("actions") == n_actions).height
    repeated = bool((per_action["rows"] > per_action["tasks"]).any())
    md = [f"## Rule actions ({rewriter})\n"]
    if complete == n_tasks and not repeated:
        md.append(
            f"Each of the {_n(n_actions, 'action')} was evaluated once on each of the "
            f"{_n(n_tasks, 'task')}.\n"
        )
    else:
        md.append(
            f"{_n(n_actions, 'action')} over {_n(n_tasks, 'task')}; {complete} of the tasks have a row for "
            "every action (each action's own count is in the table)."
            + (
                " Some (task, action) cells have several rows (seeds); each cell counts once, by the "
                "geomean of its rows."
                if repeated
                else ""
            )
            + "\n"
        )
    shown = per_action if complete < n_tasks else per_action.drop("best per task, same tasks")
    md.append(markdown_table(shown))  # the last column only says something when the tasks differ
    bound = per_task.select(geomean_expr("best")).item()  # over every task: a bound when all are complete
    several = per_task.filter(pl.col("actions") > 1)
    strict = (
        several.filter(pl.col("top").list.len() == 1)
        .group_by(pl.col("top").list.first().alias("action"))
        .len()
        .sort(["len", "action"], descending=[True, False])
    )
    ties = several.filter(pl.col("top").list.len() > 1).height
    if several.height:
        wins = (
            f" Of the {_n(several.height, 'task')} with two or more actions recorded, one action is strictly "
            "best on: "
            + (", ".join(f"{a} {n}" for a, n in strict.rows()) or "none")
            + f"; several tie for best on {ties}."
        )
    else:
        wins = " No task has more than one action recorded, so no action is compared with another there."
    names = per_action["action"].to_list()
    if complete == n_tasks:
        top = per_action.filter(pl.col("geomean speedup") == pl.col("geomean speedup").max())
        md.append(
            f"\nBest action per task, over the {_n(n_tasks, 'task')}: geomean {bound:.3f}x, an upper bound "
            "for any policy that picks one of these actions per task; the best single action gives "
            f"{top['geomean speedup'][0]:.3f}x ({' = '.join(top['action'].to_list())}).{wins}\n"
        )
        labels, values = [*names, "best per task"], [*per_action["geomean speedup"].to_list(), bound]
        marks: list[float | None] = []
    else:  # different tasks per action: compare each with the per-task best on its own tasks only
        pairs = ", ".join(
            f"{a} {g:.3f}x vs {b:.3f}x ({_n(k, 'task')})"
            for a, k, g, b in per_action.select(
                "action", "tasks", "geomean speedup", "best per task, same tasks"
            ).rows()
        )
        md.append(
            "\nThe actions were recorded on different tasks, so no one bound covers them all. On each "
            "action's own tasks, the best action per task (for each task the best of the actions recorded "
            f"for it; a missing action is not counted) gives at least the action itself: {pairs}.{wins}\n"
        )
        labels = [
            a if k == n_tasks else f"{a} ({k} of {n_tasks} tasks)"
            for a, k in per_action.select("action", "tasks").rows()
        ]
        values, marks = (
            per_action["geomean speedup"].to_list(),
            per_action["best per task, same tasks"].to_list(),
        )
    png = _bars(
        out / f"actions_{_slug(rewriter)}.png",
        labels,
        values,
        f"geomean effective speedup per rule action, {rewriter}",
        "geomean effective speedup (1.0 = unchanged)",
        base=1.0,
        marks=marks,
        mark_label="best action per task, on the same tasks",
    )
    md.append(f"\n![actions]({png.name})\n")
    return md


def oracle_matrix(rewards: pl.DataFrame, rewriter: str, seed: int = 0) -> pl.DataFrame:
    """``analysis.outcome_matrix``-shaped rows from recorded configuration rows (round 0, one rewriter):
    ``config_name`` is the ``CONFIGURATIONS`` name of the shown groups (the groups joined otherwise,
    ``(none)`` for none)."""
    from autoprofiler.profiling.groups import CONFIGURATIONS
    from autoprofiler.rewards import configuration_name

    named = {configuration_name(groups): name for name, groups in CONFIGURATIONS.items()}
    configuration = pl.col("configuration").fill_null("")
    return rewards.filter(
        (pl.col("kind") != "action") & (pl.col("round") == 0) & (pl.col("seed") == seed),
        pl.col("rewriter") == rewriter,
    ).select(
        "task_id",
        "task_hash",
        "level",
        pl.when(configuration.is_in(list(named)))
        .then(configuration.replace(named))
        .when(configuration == "")
        .then(pl.lit("(none)"))
        .otherwise(configuration)
        .alias("config_name"),
        "configuration",
        "action",
        pl.col("correct").fill_null(False),
        "speedup",
        "effective_speedup",
        "reward",
        pl.lit("").alias("missing"),
    )


def _oracle_section(rewards: pl.DataFrame, rewriter: str, out: Path) -> list[str]:
    """The fixed configurations (``CONFIGURATIONS``) recorded for one rewriter against the per-task oracle
    over them; rows of other shown-group sets (a tree's leaves) are not fixed configurations: left out."""
    from autoprofiler.profiling.groups import CONFIGURATIONS

    every = oracle_matrix(rewards, rewriter)
    matrix = every.filter(pl.col("config_name").is_in(list(CONFIGURATIONS)))
    names = matrix["config_name"].unique(maintain_order=True).to_list()
    if len(names) < 2:
        return []
    heading = f"## Oracle sweep ({rewriter}): fixed configurations vs the per-task oracle\n"
    others = every["config_name"].n_unique() - len(names)
    note = (
        f"; {_n(others, 'other shown-group set')}, such as a tree's leaves, left out: not fixed "
        "configurations"
        if others
        else ""
    )
    oa = oracle_analysis(matrix)
    if not oa.get("tasks"):
        return [
            heading,
            f"No task was answered for every one of the {len(names)} fixed configurations"
            + (f" ({note[2:]})" if others else "")
            + ".\n",
        ]
    pc = oa["per_configuration"]
    table = pl.DataFrame([{"configuration": n, **pc[n]} for n in oa["configurations"]]).rename(
        {"geomean_speedup": "geomean speedup"}
    )
    lo, hi = oa["relative_gain_ci"]
    best_geomean = oa["best_static_geomean"]
    tied = [
        n for n in oa["configurations"] if n != oa["best_static"] and pc[n]["geomean_speedup"] == best_geomean
    ]
    md = [
        heading,
        markdown_table(table),
        f"\n{_n(oa['tasks'], 'task')} answered for every configuration ({len(oa['skipped'])} skipped{note}). "
        f"Wins: tasks where the configuration is strictly best; ties: {_n(oa['ties'], 'task')} where "
        f"several share the best. Best static: **{oa['best_static']}** ({oa['best_static_geomean']:.3f}x"
        + (f"; tied with {', '.join(tied)}" if tied else "")
        + "); "
        f"per-task oracle {oa['oracle_geomean']:.3f}x; relative gain **{oa['relative_gain']:.3f}** "
        f"(bootstrap {oa['confidence']:.0%} CI [{lo:.3f}, {hi:.3f}], {oa['bootstrap']} resamples).\n",
    ]
    slug = _slug(rewriter)
    wins = [pc[n]["wins"] for n in oa["configurations"]]
    if sum(wins):
        png = _bars(
            out / f"oracle_wins_{slug}.png",
            oa["configurations"],
            wins,
            f"tasks where each configuration is strictly best, {rewriter} (of {oa['tasks']}; "
            f"{oa['ties']} ties)",
            "tasks",
            fmt="g",
        )
        md.append(f"\n![wins]({png.name})\n")
    else:
        md.append(
            f"\nNo configuration is strictly best on any task (ties: {oa['ties']} of {oa['tasks']}), "
            "so there is no wins chart.\n"
        )
    png = _bars(
        out / f"static_speedup_{slug}.png",
        [*oa["configurations"], "per-task oracle"],
        [*(pc[n]["geomean_speedup"] for n in oa["configurations"]), oa["oracle_geomean"]],
        f"geomean effective speedup, {rewriter} ({_n(oa['tasks'], 'task')})",
        "geomean effective speedup (1.0 = unchanged)",
        base=1.0,
    )
    md.append(f"\n![static]({png.name})\n")
    return md


def _rounds_section(rewards: pl.DataFrame) -> list[str]:
    later = rewards.filter((pl.col("round") > 0) & (pl.col("kind") != "action"))
    if later.is_empty():
        return []
    table = (
        later.group_by("round")
        .agg(
            pl.len().alias("rows"),
            geomean_expr("effective_speedup").alias("geomean speedup"),
            pl.col("correct").fill_null(False).mean().alias("accuracy"),
        )
        .sort("round")
    )
    return ["## Rounds > 0 in the table\n", markdown_table(table)]
