"""A Markdown report with PNG plots, from reward tables (and, when given, a training run's outputs).

    python -m autoprofiler.report TABLE_DIR --out reports/x [--run RUN_DIR] [--tree TREE.json]

``TABLE_DIR`` is a recording (``rewards/`` and ``profiles/`` Parquet tables, as ``LiveEnvironment``
writes them). From the reward table alone the report shows: what was recorded; each rule action's
outcomes; the oracle sweep over the fixed configurations recorded (per-configuration geomean, wins,
best static, per-task oracle, bootstrap CI of the oracle's relative gain: the paper's Figure 2 /
Table 6) with a wins plot; rounds > 0 as a refinement curve. With ``--run`` (a ``workflows/train.py``
output folder) it adds the held-out policy comparison (``evaluation.json``), the learned tree (text,
Mermaid and a PNG drawing), the learning log (``proposals.jsonl``) and the refinement curve
(``refinement.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from autoprofiler.analysis import geomean, oracle_analysis
from autoprofiler.tables import read_table

__all__ = ["build_report", "main", "matrix_from_rows"]

logger = logging.getLogger(__name__)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def matrix_from_rows(
    rows: list[dict[str, Any]], rewriter: str | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """``analysis.outcome_matrix``-shaped rows from recorded configuration rows (round 0, one rewriter)."""
    from autoprofiler.profiling.groups import CONFIGURATIONS
    from autoprofiler.rewards import configuration_name

    named = {configuration_name(groups): name for name, groups in CONFIGURATIONS.items()}
    out = []
    for r in rows:
        if r["kind"] == "action" or r["round"] != 0 or r["seed"] != seed:
            continue
        if rewriter is not None and r["rewriter"] != rewriter:
            continue
        out.append(
            {
                "task_id": r["task_id"],
                "task_hash": r["task_hash"],
                "level": r["level"],
                "config_name": named.get(r["configuration"], r["configuration"] or "(none)"),
                "configuration": r["configuration"],
                "action": r["action"],
                "correct": bool(r["correct"]),
                "speedup": r["speedup"],
                "effective_speedup": r["effective_speedup"],
                "reward": r["reward"],
                "missing": "",
            }
        )
    return out


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if math.isfinite(v) else "n/a"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _bar(
    path: Path, labels: list[str], values: list[float], title: str, ylabel: str, line: float | None = None
):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(labels) + 2), 3.6))
    ax.bar(range(len(labels)), values, color="#4C72B0")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    if line is not None:
        ax.axhline(line, color="grey", lw=0.8, ls="--")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_tree(tree: Any, path: Path) -> Path:
    """A PNG of a profiling tree: splits as rounded boxes (feature <= threshold), leaves with groups."""
    plt = _plt()
    from autoprofiler.tree import Split

    pos: dict[str, tuple[float, float]] = {}
    counter = [0]

    def place(node_id: str, depth: int) -> float:
        node = tree.node(node_id)
        if isinstance(node, Split):
            x = (place(node.left, depth + 1) + place(node.right, depth + 1)) / 2
        else:
            x = float(counter[0])
            counter[0] += 1
        pos[node_id] = (x, -depth)
        return x

    place(tree.root.id, 0)
    width = max(counter[0], 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 2.8 * width), 1.8 + 1.6 * (tree.depth + 1)))
    for node in tree.nodes:
        x, y = pos[node.id]
        if isinstance(node, Split):
            for child, label in ((node.left, "<="), (node.right, ">")):
                cx, cy = pos[child]
                ax.plot([x, cx], [y, cy], color="grey", lw=0.8, zorder=1)
                ax.text(
                    (x + cx) / 2,
                    (y + cy) / 2,
                    f"{label} {node.threshold:.3g}",
                    fontsize=7,
                    ha="center",
                    bbox={"fc": "white", "ec": "none", "pad": 0.5},
                    zorder=2,
                )
            text, color = f"{node.feature}\n[{', '.join(node.groups)}]", "#DDE8F5"
        else:
            text, color = f"leaf {node.id}\n" + ("\n".join(node.groups) or "(none)"), "#E3F1DF"
        ax.text(
            x,
            y,
            text,
            ha="center",
            va="center",
            fontsize=7,
            zorder=3,
            bbox={"boxstyle": "round,pad=0.4", "fc": color, "ec": "#555555"},
        )
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-tree.depth - 0.7, 0.7)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _refinement_plot(path: Path, rows: list[dict[str, Any]]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    by_round: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        if not r.get("missing"):
            by_round[int(r["round"])].append(r)
    rounds = sorted(by_round)
    xs = [sum(r["cumulative_seconds"] for r in by_round[k]) / len(by_round[k]) for k in rounds]
    ys = [geomean(r["cumulative_speedup"] for r in by_round[k]) for k in rounds]
    ax.plot(xs, ys, marker="o")
    for k, x, y in zip(rounds, xs, ys, strict=True):
        ax.annotate(f"r{k}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("mean cumulative seconds per task (profiling + evaluation)")
    ax.set_ylabel("geomean cumulative speedup")
    ax.set_title("iterative refinement", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_report(
    table_dir: str | Path,
    out: str | Path,
    run_dir: str | Path | None = None,
    tree_path: str | Path | None = None,
    title: str = "autoprofiler report",
) -> Path:
    """Write ``out/report.md`` and its PNGs; returns the Markdown path.

    Raises:
        FileNotFoundError: ``table_dir`` has no ``rewards/`` table.
    """
    table_dir, out = Path(table_dir), Path(out)
    rewards_dir = table_dir / "rewards"
    if not rewards_dir.is_dir():
        raise FileNotFoundError(
            f"expected a reward table at {rewards_dir} (a recording folder); it is not there"
        )
    out.mkdir(parents=True, exist_ok=True)
    rows = read_table(rewards_dir, "reward").to_pylist()
    profiles = (
        read_table(table_dir / "profiles", "profile").to_pylist() if (table_dir / "profiles").is_dir() else []
    )
    run = Path(run_dir) if run_dir else None
    md = [f"# {title}\n", f"Tables: `{table_dir}`" + (f"; run: `{run}`" if run else "") + "\n"]

    # --- what was recorded
    tasks = {r["task_hash"] for r in rows}
    md.append("## Recorded data\n")
    md.append(
        _table(
            ["what", "value"],
            [
                ["reward rows", len(rows)],
                ["tasks", len(tasks)],
                ["rewriters", ", ".join(sorted({r["rewriter"] for r in rows}))],
                ["devices", ", ".join(sorted({r["device"] or "?" for r in rows}))],
                ["profile rows (task x group)", len(profiles)],
                ["profile groups", ", ".join(sorted({p["group"] for p in profiles}))],
                ["rounds", ", ".join(str(x) for x in sorted({r["round"] for r in rows}))],
            ],
        )
    )

    # --- rule actions
    actions = [r for r in rows if r["kind"] == "action" and r["round"] == 0]
    if actions:
        md.append("## Rule actions (every action evaluated on every task)\n")
        by_action: dict[str, list[dict]] = defaultdict(list)
        for r in actions:
            by_action[r["action"]].append(r)
        table = []
        for a, rs in sorted(by_action.items()):
            errors = Counter(r["error_kind"] for r in rs if r["error_kind"])
            table.append(
                [
                    a,
                    len(rs),
                    sum(r["correct"] for r in rs) / len(rs),
                    geomean(r["effective_speedup"] for r in rs),
                    sum(1 for r in rs if r["correct"] and (r["speedup"] or 0) > 1) / len(rs),
                    ", ".join(f"{k} {v}" for k, v in errors.most_common()) or "-",
                ]
            )
        md.append(_table(["action", "tasks", "accuracy", "geomean speedup", "fast_1", "errors"], table))
        per_task_best = defaultdict(lambda: (None, -1.0))
        for r in actions:
            if r["effective_speedup"] > per_task_best[r["task_hash"]][1]:
                per_task_best[r["task_hash"]] = (r["action"], r["effective_speedup"])
        best_geo = geomean(v for _, v in per_task_best.values())
        md.append(
            f"\nBest action per task (an upper bound for any rule policy): geomean {best_geo:.3f}; "
            f"best action counts: {dict(Counter(a for a, _ in per_task_best.values()))}.\n"
        )

    # --- oracle sweep over the recorded configurations
    for rewriter in sorted({r["rewriter"] for r in rows}):
        matrix = matrix_from_rows(rows, rewriter)
        names = sorted({m["config_name"] for m in matrix})
        if len(names) < 2:
            continue
        oa = oracle_analysis(matrix)
        if not oa.get("tasks"):
            continue
        slug = "".join(c if c.isalnum() else "_" for c in rewriter)
        md.append(f"## Oracle sweep ({rewriter}): fixed configurations vs the per-task oracle\n")
        pc = oa["per_configuration"]
        md.append(
            _table(
                ["configuration", "geomean speedup", "accuracy", "wins"],
                [
                    [n, pc[n]["geomean_speedup"], pc[n]["accuracy"], pc[n]["wins"]]
                    for n in oa["configurations"]
                ],
            )
        )
        lo, hi = oa["relative_gain_ci"]
        md.append(
            f"\nTasks: {oa['tasks']} (skipped, not answered for every configuration: {len(oa['skipped'])}); "
            f"ties: {oa['ties']}. Best static: **{oa['best_static']}** ({oa['best_static_geomean']:.3f}x); "
            f"oracle {oa['oracle_geomean']:.3f}x; relative gain **{oa['relative_gain']:.3f}** "
            f"(bootstrap {oa['confidence']:.0%} CI [{lo:.3f}, {hi:.3f}], {oa['bootstrap']} resamples).\n"
        )
        png = out / f"oracle_wins_{slug}.png"
        _bar(
            png,
            list(oa["configurations"]),
            [pc[n]["wins"] for n in oa["configurations"]],
            f"tasks won (strictly best) per configuration, {rewriter}",
            "tasks",
        )
        md.append(f"\n![wins]({png.name})\n")
        png = out / f"static_speedup_{slug}.png"
        labels = list(oa["configurations"]) + ["oracle"]
        _bar(
            png,
            labels,
            [pc[n]["geomean_speedup"] for n in oa["configurations"]] + [oa["oracle_geomean"]],
            f"geomean effective speedup, {rewriter}",
            "speedup",
            line=1.0,
        )
        md.append(f"\n![static]({png.name})\n")

    # --- a training run
    if run is not None:
        md += _run_sections(run, out)
    tree_file = (
        Path(tree_path)
        if tree_path
        else (run / "tree.json" if run and (run / "tree.json").exists() else None)
    )
    if tree_file is not None:
        md += _tree_section(tree_file, out)

    # --- refinement from the tables (rounds > 0) when the run did not bring its own
    if not (run and (run / "refinement.json").exists()):
        later = [r for r in rows if r["round"] > 0 and r["kind"] != "action"]
        if later:
            md.append("## Rounds > 0 in the table\n")
            by_round = defaultdict(list)
            for r in later:
                by_round[r["round"]].append(r)
            md.append(
                _table(
                    ["round", "rows", "geomean speedup", "accuracy"],
                    [
                        [
                            k,
                            len(v),
                            geomean(r["effective_speedup"] for r in v),
                            sum(r["correct"] for r in v) / len(v),
                        ]
                        for k, v in sorted(by_round.items())
                    ],
                )
            )
    path = out / "report.md"
    path.write_text("\n".join(md))
    logger.info("wrote %s", path)
    return path


def _run_sections(run: Path, out: Path) -> list[str]:
    md: list[str] = []
    ev = run / "evaluation.json"
    if ev.exists():
        data = json.loads(ev.read_text())
        summary = data["summary"]
        md.append(
            f"## Policies on held-out tasks ({data.get('split', 'test')}: {data.get('tasks', '?')} tasks)\n"
        )
        cols = [
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
        md.append(_table(["policy", *cols], [[p, *[s.get(c) for c in cols]] for p, s in summary.items()]))
        if data.get("verdict"):
            md.append(f"\n{data['verdict']}\n")
        png = out / "policy_speedup.png"
        _bar(
            png,
            list(summary),
            [s["geomean_speedup"] for s in summary.values()],
            "geomean effective speedup per policy (held-out tasks)",
            "speedup",
            line=1.0,
        )
        md.append(f"\n![policies]({png.name})\n")
        levels = sorted({lvl for s in summary.values() for lvl in s.get("by_level", {})})
        if len(levels) > 1:
            md.append("\nPer tier (geomean speedup / accuracy):\n")
            md.append(
                _table(
                    ["policy", *[f"level {lvl}" for lvl in levels]],
                    [
                        [
                            p,
                            *[_level_cell(s["by_level"].get(lvl)) for lvl in levels],
                        ]
                        for p, s in summary.items()
                    ],
                )
            )
    log = run / "proposals.jsonl"
    if log.exists():
        decisions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        md.append(
            f"## Learning log ({len(decisions)} decisions, "
            f"{sum(d['accepted'] for d in decisions)} accepted)\n"
        )
        md.append(
            _table(
                ["#", "proposal", "affected", "mean gain", "LCB", "accepted", "why"],
                [
                    [
                        d["decision"],
                        d["description"],
                        d["affected_tasks"],
                        (d["stats"] or {}).get("mean"),
                        (d["stats"] or {}).get("lcb"),
                        "yes" if d["accepted"] else "no",
                        d["reason"].splitlines()[0][:90],
                    ]
                    for d in decisions
                ],
            )
        )
        state = run / "state.json"
        if state.exists():
            ev = json.loads(state.read_text()).get("evaluations", {})
            md.append(
                f"\nEvaluations: probe sweep {ev.get('sweep')}, "
                f"candidate evaluations spent {ev.get('spent')} "
                f"vs {ev.get('naive')} for a naive full re-evaluation of every candidate; "
                f"new (task, configuration) cells {ev.get('new_cells')}.\n"
            )
    ref = run / "refinement.json"
    if ref.exists():
        rows = json.loads(ref.read_text())["rows"]
        md.append("## Iterative refinement\n")
        missing = [r for r in rows if r.get("missing")]
        if missing:
            md.append(
                f"{len(missing)} task(s) stopped early (the environment could not answer a round); first: "
                f"{missing[0]['missing'][:200]}\n"
            )
        if any(not r.get("missing") for r in rows):
            png = out / "refinement.png"
            _refinement_plot(png, rows)
            md.append(f"\n![refinement]({png.name})\n")
    return md


def _level_cell(s: dict | None) -> str:
    return "-" if s is None else f"{s['geomean_speedup']:.3f} / {s['accuracy']:.2f}"


def _tree_section(tree_file: Path, out: Path) -> list[str]:
    from autoprofiler.tree import export_mermaid, export_text, load_tree

    tree = load_tree(tree_file)
    md = [
        f"## Tree (`{tree_file.name}`, fingerprint {tree.fingerprint()})\n",
        "```\n" + export_text(tree) + "```\n",
        "```mermaid\n" + export_mermaid(tree) + "```\n",
    ]
    try:
        png = draw_tree(tree, out / "tree.png")
        md.append(f"\n![tree]({png.name})\n")
    except Exception as e:  # the drawing is a nice-to-have; the text above is the record
        logger.warning("could not draw the tree: %s", e)
    return md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autoprofiler.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("table_dir", help="a recording folder with rewards/ (and profiles/)")
    parser.add_argument("--out", required=True, help="output folder for report.md and PNGs")
    parser.add_argument("--run", default=None, help="a workflows/train.py output folder (optional)")
    parser.add_argument("--tree", default=None, help="a tree JSON to draw (optional)")
    parser.add_argument("--title", default="autoprofiler report")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        path = build_report(args.table_dir, args.out, args.run, args.tree, args.title)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
