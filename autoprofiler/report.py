"""A Markdown report with PNG plots, from reward tables (and, when given, a training run's outputs).

    python -m autoprofiler.report TABLE_DIR --out runs/x [--run RUN_DIR] [--tree TREE.json] [--overwrite]

``TABLE_DIR`` is a recording (``rewards/`` and ``profiles/`` Parquet tables, as ``LiveEnvironment``
writes them), read as polars frames (``analysis.reward_frame``: schema checked); every table in the
report is a polars aggregation of those frames or of the run's rows, and every sentence states numbers
computed from them. From the reward table alone the report shows: what was recorded; each rule
action's outcomes and the best action per task (per task the best of the actions recorded for it; a
missing action is not counted, and each action is compared with it on that action's own tasks); the
oracle sweep over the fixed configurations recorded (per-configuration geomean, wins, best static,
per-task oracle, bootstrap CI of the oracle's relative gain: the paper's Figure 2 / Table 6); rounds > 0.
With ``--run`` (a ``workflows/train.py`` output folder) it adds the held-out policy comparison (from
``evaluation.json``'s rows), the learned tree (text, Mermaid and a PNG drawing), the learning log
(``proposals.jsonl``) and the refinement curve (``refinement.json``).

Bar charts carry their values; a chart with nothing to show (no configuration ever strictly best) is
not drawn, and the report says why. ``main`` refuses an ``--out`` that holds a report or that git tracks
(``reports/``) unless ``--overwrite``: reports go under ``runs/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from autoprofiler.analysis import (
    geomean_expr,
    oracle_analysis,
    outcome_frame,
    profile_frame,
    reward_frame,
    summary_frame,
)
from autoprofiler.tables import TableSchemaError

__all__ = [
    "best_action_per_task",
    "build_report",
    "draw_tree",
    "main",
    "markdown_table",
    "oracle_matrix",
    "out_problem",
    "tracked_folder",
]

logger = logging.getLogger(__name__)

POLICY_COLUMNS = [
    "geomean_speedup",
    "accuracy",
    "fast_0",
    "fast_1",
    "fast_1.5",
    "fast_2",
    "mean_reward",
    "passes_per_task",
    "profile_seconds_per_task",
    "llm_calls_per_task",
    "missing",
]


# --- Markdown and plots --------------------------------------------------------------------------------
def markdown_table(frame: pl.DataFrame, formats: dict[str, str] | None = None) -> str:
    """``frame`` as a Markdown table: floats with 3 decimals (or ``formats[column]``), nulls empty.

    >>> print(markdown_table(pl.DataFrame({"a": ["x"], "b": [1.23456]})), end="")
    | a | b |
    |---|---|
    | x | 1.235 |
    """
    formats = formats or {}

    def fmt(column: str, v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return format(v, formats.get(column, ".3f")) if math.isfinite(v) else "n/a"
        return str(v)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    lines += [
        "| " + " | ".join(fmt(c, v) for c, v in zip(frame.columns, row, strict=True)) + " |"
        for row in frame.rows()
    ]
    return "\n".join(lines) + "\n"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    path: Path,
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    xlabel: str,
    base: float = 0.0,
    fmt: str = ".3f",
    marks: Sequence[float | None] = (),
    mark_label: str = "",
) -> Path:
    """Horizontal bars from ``base`` (1.0 for speedups: a bar to the left is a slowdown), each with its
    value written at its end. ``marks`` (one per bar, None for none): a black diamond on a bar's row, for
    a value it is compared with (drawn where it differs from the bar), named ``mark_label`` in a legend."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    values = [float(v) for v in values]
    drawn = [(i, float(m)) for i, m in enumerate(marks) if m is not None and abs(float(m) - values[i]) > 1e-9]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.36 * len(labels)))
    colors = ["#4C72B0" if v >= base else "#DD8452" for v in values]
    bars = ax.barh(range(len(labels)), [v - base for v in values], left=base, color=colors, height=0.6)
    ax.bar_label(bars, labels=[format(v, fmt) for v in values], padding=3, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    if all(v == int(v) for v in values):  # counts: whole-number ticks
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:  # the diamonds explained under the axis: a legend box would cover bars
        ax.scatter([m for _, m in drawn], [i for i, _ in drawn], marker="D", s=22, color="black", zorder=3)
        for i, m in drawn:
            ax.annotate(format(m, fmt), (m, i), xytext=(6, 0), textcoords="offset points", fontsize=7,
                        ha="left", va="center", color="#333333")  # fmt: skip
        xlabel = f"{xlabel}\n\u25c6 {mark_label}"
    ax.invert_yaxis()  # first label on top, as in the table
    ax.axvline(base, color="grey", lw=0.8)
    everything = [*values, *(m for _, m in drawn), base]
    lo, hi = min(everything), max(everything)
    span = (hi - lo) or abs(hi) or 1.0
    ax.set_xlim(lo - (0.18 * span if lo < base else 0.02 * span), hi + 0.18 * span)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_tree(tree: Any, path: Path) -> Path:
    """A PNG of a profiling tree: splits (feature, the groups collected there), edges labelled with the
    threshold test, leaves with their groups. The canvas is cropped to the drawing."""
    plt = _plt()
    from autoprofiler.tree import Split

    pos: dict[str, tuple[float, float]] = {}
    leaves = [0]

    def place(node_id: str, depth: int) -> float:
        node = tree.node(node_id)
        if isinstance(node, Split):
            x = (place(node.left, depth + 1) + place(node.right, depth + 1)) / 2
        else:
            x = float(leaves[0])
            leaves[0] += 1
        pos[node_id] = (x, -depth)
        return x

    place(tree.root.id, 0)
    texts = {}
    for node in tree.nodes:
        if isinstance(node, Split):
            texts[node.id] = f"{node.feature}\ncollect: {', '.join(node.groups) or '(none)'}"
        else:
            texts[node.id] = f"leaf {node.id}\n" + ("\n".join(node.groups) or "(no groups)")
    longest = max(len(line) for t in texts.values() for line in t.splitlines())
    unit = min(max(1.8, 0.062 * longest), 4.2)  # inches per leaf: the widest label fits
    fig, ax = plt.subplots(figsize=(unit * max(leaves[0], 1), 0.9 + 1.4 * tree.depth))
    for node in tree.nodes:
        x, y = pos[node.id]
        if isinstance(node, Split):
            for child, test in ((node.left, "≤"), (node.right, ">")):
                cx, cy = pos[child]
                ax.plot([x, cx], [y, cy], color="grey", lw=0.9, zorder=1)
                ax.text(
                    (x + cx) / 2,
                    (y + cy) / 2,
                    f"{test} {node.threshold:g}",
                    fontsize=8,
                    ha="center",
                    va="center",
                    bbox={"fc": "white", "ec": "none", "pad": 0.8},
                    zorder=2,
                )
        color = "#DDE8F5" if isinstance(node, Split) else "#E3F1DF"
        ax.text(
            x,
            y,
            texts[node.id],
            ha="center",
            va="center",
            fontsize=8,
            zorder=3,
            bbox={"boxstyle": "round,pad=0.45", "fc": color, "ec": "#555555"},
        )
    ax.set_xlim(-0.5, max(leaves[0], 1) - 0.5)
    ax.set_ylim(-tree.depth - 0.3, 0.3)  # the boxes, not a margin of blank canvas
    ax.axis("off")
    n = len(tree.leaf_ids)
    title = f"profiling tree {tree.fingerprint()}: {n} {'leaf' if n == 1 else 'leaves'}, depth {tree.depth}"
    if n == 1:  # nothing to route on: say so, or the lone box reads like a drawing that failed
        title += "\none leaf: every task is shown these groups (no split was learned)"
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return path


def _n(count: int, noun: str) -> str:
    """``3 tasks``, ``1 task``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _joined(column: str, null: str = "?") -> pl.Expr:
    """The distinct values of ``column``, sorted, as one comma-separated string."""
    return pl.col(column).unique().sort().cast(pl.String).fill_null(null).str.join(", ")


# --- sections from the tables --------------------------------------------------------------------------
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


# --- sections from a training run ----------------------------------------------------------------------
def _policies_section(data: dict[str, Any], out: Path) -> list[str]:
    frame = outcome_frame(data.get("rows") or [], keys=("policy", "level"))
    if frame.is_empty():
        return ["## Policies on held-out tasks\n", "The evaluation holds no per-task rows.\n"]
    summary = summary_frame(frame, ["policy"])
    tasks = int(data.get("tasks") or summary["tasks"].max())
    md = [f"## Policies on held-out tasks ({_n(tasks, data.get('split', 'test') + ' task')})\n"]
    md.append(markdown_table(summary.select("policy", *POLICY_COLUMNS)))
    if data.get("verdict"):
        md.append(f"\n{data['verdict']}\n")
    png = _bars(
        out / "policy_speedup.png",
        summary["policy"].to_list(),
        summary["geomean_speedup"].to_list(),
        f"geomean effective speedup per policy ({_n(tasks, 'held-out task')})",
        "geomean effective speedup (1.0 = unchanged)",
        base=1.0,
    )
    md.append(f"\n![policies]({png.name})\n")
    by_level = summary_frame(frame, ["policy", "level"]).sort("level", maintain_order=True)
    levels = by_level["level"].unique().sort().to_list()
    if len(levels) > 1:
        wide = by_level.pivot(on="level", index="policy", values=["geomean_speedup", "accuracy"])
        wide = wide.select(
            "policy",
            *[
                pl.col(f"{v}_{lvl}").alias(f"level {lvl} {name}")
                for lvl in levels
                for v, name in (("geomean_speedup", "geomean"), ("accuracy", "accuracy"))
            ],
        )
        md += ["\nPer tier:\n", markdown_table(wide)]
    return md


def _learning_section(run: Path) -> list[str]:
    decisions = [json.loads(line) for line in (run / "proposals.jsonl").read_text().splitlines() if line]
    log = pl.DataFrame(
        {
            "#": [d["decision"] for d in decisions],
            "proposal": [d["description"] for d in decisions],
            "affected": [d["affected_tasks"] for d in decisions],
            "mean gain": pl.Series([(d["stats"] or {}).get("mean") for d in decisions], dtype=pl.Float64),
            "LCB": pl.Series([(d["stats"] or {}).get("lcb") for d in decisions], dtype=pl.Float64),
            "accepted": pl.Series([bool(d["accepted"]) for d in decisions], dtype=pl.Boolean),
            "why": [d["reason"].splitlines()[0][:90] if d["reason"] else "" for d in decisions],
        }
    )
    accepted = int(log["accepted"].sum()) if log.height else 0
    table = log.with_columns(
        pl.when("accepted").then(pl.lit("yes")).otherwise(pl.lit("no")).alias("accepted")
    )
    md = [f"## Learning log ({log.height} decisions, {accepted} accepted)\n", markdown_table(table)]
    state = run / "state.json"
    if state.exists():
        ev = json.loads(state.read_text()).get("evaluations", {})
        md.append(
            f"\nEvaluations: probe sweep {ev.get('sweep')}, candidate evaluations spent {ev.get('spent')} "
            f"vs {ev.get('naive')} for a naive full re-evaluation of every candidate; new (task, "
            f"configuration) cells {ev.get('new_cells')}.\n"
        )
    return md


def _refinement_section(rows: list[dict[str, Any]], out: Path) -> list[str]:
    md = ["## Iterative refinement\n"]
    missing = [r for r in rows if r.get("missing")]
    if missing:
        md.append(
            f"{len(missing)} task(s) stopped early (the environment could not answer a round); first: "
            f"{missing[0]['missing'][:200]}\n"
        )
    answered = [r for r in rows if not r.get("missing")]
    if not answered:
        return md
    frame = pl.DataFrame(
        {
            "round": [int(r["round"]) for r in answered],
            "speedup": pl.Series([r["cumulative_speedup"] for r in answered], dtype=pl.Float64),
            "seconds": pl.Series([r["cumulative_seconds"] for r in answered], dtype=pl.Float64),
        }
    )
    curve = (
        frame.group_by("round")
        .agg(
            pl.len().alias("tasks"),
            geomean_expr("speedup").alias("geomean cumulative speedup"),
            pl.col("seconds").mean().alias("mean cumulative seconds"),
        )
        .sort("round")
    )
    md.append(markdown_table(curve))
    if curve.height < 2:
        md.append(
            f"\nOnly round {curve['round'][0]} was answered, so there is no refinement curve to draw.\n"
        )
        return md
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    xs, ys = curve["mean cumulative seconds"].to_list(), curve["geomean cumulative speedup"].to_list()
    ax.plot(xs, ys, marker="o")
    for k, x, y in zip(curve["round"].to_list(), xs, ys, strict=True):
        ax.annotate(f"round {k}: {y:.3f}x", (x, y), fontsize=8, textcoords="offset points", xytext=(4, 4))
    ax.margins(x=0.25, y=0.15)  # room for the labels
    ax.set_xlabel("mean cumulative seconds per task (profiling + evaluation)")
    ax.set_ylabel("geomean cumulative speedup")
    ax.set_title("iterative refinement", fontsize=10)
    fig.tight_layout()
    png = out / "refinement.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    md.append(f"\n![refinement]({png.name})\n")
    return md


def _tree_section(tree_file: Path, out: Path) -> list[str]:
    from autoprofiler.tree import export_mermaid, export_text, load_tree

    tree = load_tree(tree_file)
    md = [
        f"## Tree (`{tree_file.name}`, fingerprint {tree.fingerprint()})\n",
        "```\n" + export_text(tree) + "```\n",
        "```mermaid\n" + export_mermaid(tree) + "```\n",
    ]
    png = draw_tree(tree, out / "tree.png")
    md.append(f"\n![tree]({png.name})\n")
    return md


# --- the report ----------------------------------------------------------------------------------------
def build_report(
    table_dir: str | Path,
    out: str | Path,
    run_dir: str | Path | None = None,
    tree_path: str | Path | None = None,
    title: str = "autoprofiler report",
    tasks: Sequence[str] | None = None,
) -> Path:
    """Write ``out/report.md`` and its PNGs; returns the Markdown path.

    A report already in ``out`` is replaced whole: the PNGs its ``report.md`` shows are removed first, so
    no chart of an earlier report stays beside the new one.

    Args:
        table_dir: a recording folder with ``rewards/`` (and ``profiles/``).
        out: the output folder (created).
        run_dir: a ``workflows/train.py`` output folder to add (evaluation, learning log, refinement).
        tree_path: a tree JSON to show; default: the run's ``tree.json`` when there is one.
        title: the report's first heading.
        tasks: task hashes to report on (a run's tasks, when its tables hold others too); None: all.

    Raises:
        FileNotFoundError: ``table_dir`` has no ``rewards/`` table.
        tables.TableSchemaError: a table part of another table or a newer schema.
    """
    table_dir, out = Path(table_dir), Path(out)
    rewards_dir = table_dir / "rewards"
    if not rewards_dir.is_dir():
        raise FileNotFoundError(
            f"expected a reward table at {rewards_dir} (a recording folder); it is not there"
        )
    _remove_previous(out)
    out.mkdir(parents=True, exist_ok=True)
    rewards = reward_frame(rewards_dir)
    profiles = profile_frame(table_dir / "profiles") if (table_dir / "profiles").is_dir() else None
    where = f"Tables: `{table_dir}`"
    if tasks is not None:
        wanted = sorted(set(tasks))
        rewards = rewards.filter(pl.col("task_hash").is_in(wanted))
        profiles = None if profiles is None else profiles.filter(pl.col("task_hash").is_in(wanted))
        where += f", restricted to the {_n(len(wanted), 'task')} of this run"
    if rewards.is_empty():
        raise ValueError(
            f"{rewards_dir} holds no reward row" + (" for these tasks" if tasks is not None else "")
        )
    run = Path(run_dir) if run_dir else None
    md = [f"# {title}\n", where + (f"; run: `{run}`" if run else "") + "\n"]
    md += _recorded_section(rewards, profiles)
    actions = rewards.filter((pl.col("kind") == "action") & (pl.col("round") == 0))
    for rewriter in sorted(actions["rewriter"].unique().to_list()):
        md += _actions_section(actions.filter(pl.col("rewriter") == rewriter), rewriter, out)
    for rewriter in sorted(rewards["rewriter"].unique().to_list()):
        md += _oracle_section(rewards, rewriter, out)
    if run is not None:
        if (run / "evaluation.json").exists():
            md += _policies_section(json.loads((run / "evaluation.json").read_text()), out)
        if (run / "proposals.jsonl").exists():
            md += _learning_section(run)
        if (run / "refinement.json").exists():
            md += _refinement_section(json.loads((run / "refinement.json").read_text())["rows"], out)
    tree_file = (
        Path(tree_path)
        if tree_path
        else (run / "tree.json" if run and (run / "tree.json").exists() else None)
    )
    if tree_file is not None:
        md += _tree_section(tree_file, out)
    if not (run and (run / "refinement.json").exists()):  # the run's own curve replaces the table's
        md += _rounds_section(rewards)
    path = out / "report.md"
    path.write_text("\n".join(md))
    logger.info("wrote %s", path)
    return path


def _remove_previous(out: Path) -> None:
    """Remove the PNGs an earlier ``out/report.md`` shows (and the Markdown): a report is replaced whole."""
    old = out / "report.md"
    if not old.exists():
        return
    for name in re.findall(r"!\[[^\]]*\]\(([^)/]+\.png)\)", old.read_text()):
        (out / name).unlink(missing_ok=True)
    old.unlink()


def tracked_folder(out: Path) -> bool:
    """Whether ``out`` lies in a git work tree and is not ignored there: files written into it would show
    up as untracked changes (``reports/``), unlike ``runs/``, which the repository ignores."""
    anchor = out.resolve()
    while not anchor.exists():
        anchor = anchor.parent
    try:
        top = subprocess.run(
            ["git", "-C", str(anchor), "rev-parse", "--show-toplevel"], capture_output=True, text=True
        )
        if top.returncode != 0:
            return False
        ignored = subprocess.run(
            ["git", "-C", top.stdout.strip(), "check-ignore", "-q", str(out.resolve() / "report.md")]
        )
    except OSError:  # no git here
        return False
    return ignored.returncode == 1


def out_problem(out: Path, overwrite: bool) -> str | None:
    """Why ``--out`` is refused without ``--overwrite``: it holds a report already, or it is a folder of
    the repository that git tracks."""
    if overwrite:
        return None
    if (out / "report.md").exists():
        return f"--out {out} already holds a report.md; pass --overwrite to replace it, or another --out"
    if tracked_folder(out):
        return (
            f"--out {out} is inside the repository and not ignored by git (its files would show as "
            "untracked changes); write under runs/ (e.g. --out runs/report), or pass --overwrite"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autoprofiler.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("table_dir", help="a recording folder with rewards/ (and profiles/)")
    parser.add_argument(
        "--out", required=True, help="output folder for report.md and PNGs (e.g. runs/report)"
    )
    parser.add_argument("--run", default=None, help="a workflows/train.py output folder (optional)")
    parser.add_argument("--tree", default=None, help="a tree JSON to draw (optional)")
    parser.add_argument("--title", default="autoprofiler report")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a report already in --out, or write into a folder git tracks (reports/)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    problem = out_problem(Path(args.out), args.overwrite)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        path = build_report(args.table_dir, args.out, args.run, args.tree, args.title)
    except (FileNotFoundError, TableSchemaError, ValueError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
