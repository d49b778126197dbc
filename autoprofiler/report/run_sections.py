"""Report sections from a ``workflows/train.py`` output folder: the held-out policy comparison, the
learning log, the refinement curve and the learned tree."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from autoprofiler.analysis import geomean_expr, outcome_frame, summary_frame
from autoprofiler.report.markdown import _n, markdown_table
from autoprofiler.report.plots import _bars, _refinement_curve, draw_tree
from autoprofiler.text import first_line

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


def _policies_section(data: dict[str, Any], out: Path) -> list[str]:
    frame = outcome_frame(data.get("rows") or [], keys=("policy", "level", "device"))
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
    md += _split_table(frame, "level", "Per tier", lambda level, _: f"level {level}")
    # when the held-out tasks were measured on more than one card (several recordings, unlike GPUs)
    md += _split_table(
        frame, "device", "Per card (held-out tasks in parentheses)", lambda card, n: f"{card} ({n})"
    )
    return md


def _split_table(frame: pl.DataFrame, key: str, title: str, label: Callable[[Any, int], str]) -> list[str]:
    """Geomean and accuracy per policy for each value of ``key`` (a column of the outcome frame), two
    columns per value headed ``label(value, its task count)``; nothing when fewer than two values."""
    by = summary_frame(frame, ["policy", key]).sort(key, maintain_order=True)
    values = by[key].drop_nulls().unique().sort().to_list()
    if len(values) < 2:
        return []
    tasks = {v: int(by.filter(pl.col(key) == v)["tasks"].max()) for v in values}
    wide = by.pivot(on=key, index="policy", values=["geomean_speedup", "accuracy"])
    wide = wide.select(
        "policy",
        *[
            pl.col(f"{metric}_{v}").alias(f"{label(v, tasks[v])} {name}")
            for v in values
            for metric, name in (("geomean_speedup", "geomean"), ("accuracy", "accuracy"))
        ],
    )
    return [f"\n{title}:\n", markdown_table(wide)]


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
            "why": [first_line(d["reason"], 90) for d in decisions],
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
    png = _refinement_curve(
        out / "refinement.png",
        curve["round"].to_list(),
        curve["mean cumulative seconds"].to_list(),
        curve["geomean cumulative speedup"].to_list(),
    )
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
