"""Per-task table of policies over a recorded suite, answered by the replay environment.

What each policy would give on every task of a recording (no GPU: the profiles and every rule action's
evaluation were recorded on the GPU; the rule rewriter's decision is re-run on the recorded metrics):
    python bench/replay_policies.py datasets/h200_suite --out bench/results/seed_tree_h200_replay
Policies: blind, the four fixed configurations, the seed tree, the per-task oracle. The summary is over
the tasks recorded with every group, so every policy is judged on the same tasks; a second table gives
the tasks whose recording lacks a group, each cell answered where that policy's groups were recorded
("n/a" otherwise). Both tables are polars aggregations of the outcome rows. This is not a live
`autoprofiler optimize` run: each (task, action) was evaluated once, during the recording.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.analysis import evaluate_policies, outcome_frame, summary_frame  # noqa: E402
from autoprofiler.environments import ReplayEnvironment  # noqa: E402
from autoprofiler.policies import Blind, Static, TreePolicy  # noqa: E402
from autoprofiler.profiling import CONFIGURATIONS, GROUPS  # noqa: E402
from autoprofiler.report import markdown_table  # noqa: E402
from autoprofiler.rewriters import RuleRewriter  # noqa: E402
from autoprofiler.tasks import load_tasks  # noqa: E402
from autoprofiler.tree import load_tree  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recording", help="a recording folder (profiles/ + rewards/)")
    p.add_argument("--tasks", default=str(ROOT / "datasets" / "suite"))
    p.add_argument("--tree", default=str(ROOT / "trees" / "seed.json"))
    p.add_argument("--source", default="ncu", choices=("ncu", "torch"))
    p.add_argument("--out", required=True, help="output path stem (.md and .json are written)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    rewriter = RuleRewriter()
    env = ReplayEnvironment.from_dir(args.recording, rewriter=rewriter, source=args.source)
    suite = load_tasks(args.tasks).tasks
    tasks, lacking = env.fully_recorded(suite)
    left_out = list(lacking)
    recorded = env.recorded_tasks()
    unrecorded = [t.id for t in suite if t.hash not in recorded]
    names = [n for n in CONFIGURATIONS if n.startswith("torch_") == (args.source == "torch")]
    tree = load_tree(args.tree, catalog=GROUPS)
    policies = {
        "blind": Blind(),
        **{f"static:{n}": Static(n) for n in names},
        "seed_tree": TreePolicy(tree, "seed_tree"),
        "oracle": {n: tuple(CONFIGURATIONS[n]) for n in names},
    }
    rows, summary = evaluate_policies(tasks, policies, env, rewriter)
    partial = [t for t in suite if t.id in lacking]
    partial_rows, _ = evaluate_policies(partial, policies, env, rewriter) if partial else ([], {})

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python bench/replay_policies.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rewriter": rewriter.identity,
        "tree": args.tree,
        "tasks": len(tasks),
        "left_out": left_out,
        "not_recorded": unrecorded,
    }
    data = {"meta": meta, "summary": summary, "rows": rows, "partial_rows": partial_rows}
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str))
    cols = ["blind", *[f"static:{n}" for n in names], "seed_tree", "oracle"]
    summary_table = (
        summary_frame(outcome_frame(rows, keys=("policy",)), ["policy"])
        .select(
            "policy",
            pl.col("geomean_speedup").alias("geomean speedup"),
            "accuracy",
            "fast_1",
            pl.col("passes_per_task").alias("passes/task"),
            pl.col("profile_seconds_per_task").alias("profile s/task"),
        )
        .join(pl.DataFrame({"policy": cols}).with_row_index("order"), on="policy")
        .sort("order")
        .drop("order")
    )
    formats = {"accuracy": ".2f", "fast_1": ".2f", "passes/task": ".1f", "profile s/task": ".1f"}
    lines = [
        f"# Policies on the recording `{args.recording}` (replay; rewriter {rewriter.identity})",
        "",
        f"`{meta['command']}`. {len(tasks)} tasks recorded with every group; left out (a group missing): "
        f"{', '.join(left_out) or 'none'}. Each cell: the action the rule rewriter chose when shown that "
        "policy's groups, and the recorded speedup of that action (effective: 1.0 when not correct). Not a "
        "live `optimize` run: each (task, action) was evaluated once, during the recording.",
        "",
        markdown_table(summary_table, formats).rstrip("\n"),
        "",
        markdown_table(per_task_table(rows, cols)).rstrip("\n"),
    ]
    if partial:
        answered = (
            outcome_frame(partial_rows, keys=("policy",))
            .group_by("policy")
            .agg((~pl.col("missing")).sum().alias("answered"))
        )
        counts = dict(answered.iter_rows())
        lines += [
            "",
            f"## The {len(partial)} tasks recorded without every group",
            "",
            "Cells answered where the policy's groups were recorded, else n/a; not in the summary above. "
            "Answered per policy: " + ", ".join(f"{c} {counts.get(c, 0)}/{len(partial)}" for c in cols) + ".",
            "",
            markdown_table(per_task_table(partial_rows, cols)).rstrip("\n"),
        ]
    if unrecorded:
        lines += [
            "",
            f"No profile recorded ({len(unrecorded)}; policies cannot be replayed): {', '.join(unrecorded)}.",
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    return 0


def per_task_table(rows: list[dict], policies: list[str]) -> pl.DataFrame:
    """task, the seed tree's leaf, then per policy "<action> <effective speedup>" ("n/a": unanswered)."""
    frame = pl.DataFrame(
        {
            "task": [r["task_id"] for r in rows],
            "policy": [r["policy"] for r in rows],
            "leaf": [r["leaf"] for r in rows],
            "action": [r["action"] for r in rows],
            "effective_speedup": pl.Series([r["effective_speedup"] for r in rows], dtype=pl.Float64),
            "missing": [bool(r["missing"]) for r in rows],
        }
    )
    two_decimals = pl.col("effective_speedup").map_elements(lambda v: f"{v:.2f}", return_dtype=pl.String)
    cell = (
        pl.when(pl.col("missing"))
        .then(pl.lit("n/a"))
        .otherwise(pl.format("{} {}", pl.col("action").fill_null("-"), two_decimals))
    )
    leaves = frame.filter(pl.col("policy") == "seed_tree").select(
        "task", pl.col("leaf").fill_null("n/a").alias("seed leaf")
    )
    wide = frame.with_columns(cell.alias("cell")).pivot(on="policy", index="task", values="cell")
    return leaves.join(wide, on="task", maintain_order="left").select("task", "seed leaf", *policies)


if __name__ == "__main__":
    sys.exit(main())
