"""A Markdown report with PNG plots, from reward tables (and, when given, a training run's outputs).

    python -m autoprofiler.report TABLE_DIR [TABLE_DIR ...] --out runs/x [--run RUN] [--tree TREE.json]

``TABLE_DIR`` is a recording (``rewards/`` and ``profiles/`` Parquet tables, as ``LiveEnvironment``
writes them; several are read as one, as a replay of them together does), read as polars frames
(``analysis.reward_frame``: schema checked); every table in the report is a polars aggregation of those
frames or of the run's rows, and every sentence states numbers computed from them. From the reward table
alone the report shows: what was recorded; each rule action's outcomes and the best action per task (per
task the best of the actions recorded for it; a missing action is not counted, and each action is
compared with it on that action's own tasks); the oracle sweep over the fixed configurations recorded
(per-configuration geomean, wins, best static, per-task oracle, bootstrap CI of the oracle's relative
gain: the paper's Figure 2 / Table 6); rounds > 0. With ``--run`` (a ``workflows/train.py`` output
folder) it adds the held-out policy comparison (from ``evaluation.json``'s rows), the learned tree
(text, Mermaid and a PNG drawing), the learning log (``proposals.jsonl``) and the refinement curve
(``refinement.json``).

Bar charts carry their values; a chart with nothing to show (no configuration ever strictly best) is
not drawn, and the report says why. ``main`` refuses an ``--out`` that holds a report or that git tracks
(``reports/``) unless ``--overwrite``: reports go under ``runs/``.

This module assembles the report and holds its command line; the sections are in ``table_sections``
(from the tables) and ``run_sections`` (from a training run), drawn with ``plots`` and written with
``markdown``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from autoprofiler.analysis import profile_frame, reward_frame
from autoprofiler.report.markdown import _n, markdown_table
from autoprofiler.report.plots import draw_tree
from autoprofiler.report.run_sections import POLICY_COLUMNS as POLICY_COLUMNS  # re-exported
from autoprofiler.report.run_sections import (
    _learning_section,
    _policies_section,
    _refinement_section,
    _tree_section,
)
from autoprofiler.report.table_sections import (
    _actions_section,
    _oracle_section,
    _recorded_section,
    _rounds_section,
    best_action_per_task,
    oracle_matrix,
)
from autoprofiler.tables import TableSchemaError, recording_folders

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


def build_report(
    table_dir: str | Path | Sequence[str | Path],
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
        table_dir: a recording folder with ``rewards/`` (and ``profiles/``), or several (a replay of
            them together): their tables are read as one, a key two of them hold from the first listed,
            and the report's first line names each with the rows read from it.
        out: the output folder (created).
        run_dir: a ``workflows/train.py`` output folder to add (evaluation, learning log, refinement).
        tree_path: a tree JSON to show; default: the run's ``tree.json`` when there is one.
        title: the report's first heading.
        tasks: task hashes to report on (a run's tasks, when its tables hold others too); None: all.

    Raises:
        FileNotFoundError: a ``table_dir`` has no ``rewards/`` table.
        tables.TableSchemaError: a table part of another table or a newer schema.
    """
    folders = recording_folders(table_dir)
    out = Path(out)
    for folder in folders:
        if not (folder / "rewards").is_dir():
            raise FileNotFoundError(
                f"expected a reward table at {folder / 'rewards'} (a recording folder); it is not there"
            )
    _remove_previous(out)
    out.mkdir(parents=True, exist_ok=True)
    rewards, profiles, where = _read_tables(folders)
    rewards_dir = ", ".join(str(f / "rewards") for f in folders)
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


def _read_tables(folders: Sequence[Path]) -> tuple[pl.DataFrame, pl.DataFrame | None, str]:
    """(rewards, profiles or None, the report's "Tables: ..." sentence) of one or more recordings: each
    table the union of theirs, a key two of them hold kept from the first listed (as a replay does)."""
    reward_parts = [reward_frame(f / "rewards") for f in folders]
    profile_parts = [profile_frame(f / "profiles") if (f / "profiles").is_dir() else None for f in folders]
    rewards = pl.concat(reward_parts).unique("key", keep="first", maintain_order=True)
    held = [p for p in profile_parts if p is not None]
    profiles = pl.concat(held).unique("key", keep="first", maintain_order=True) if held else None
    if len(folders) == 1:
        return rewards, profiles, f"Tables: `{folders[0]}`"
    named = [
        f"`{f}` ({_n(r.height, 'reward row')}, {_n(0 if p is None else p.height, 'profile row')})"
        for f, r, p in zip(folders, reward_parts, profile_parts, strict=True)
    ]
    shared = sum(r.height for r in reward_parts) - rewards.height
    where = f"Tables: {len(folders)} recordings read as one, {', '.join(named)}"
    if shared:
        where += f" ({_n(shared, 'reward key')} in more than one, taken from the first listed)"
    return rewards, profiles, where


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
    parser.add_argument(
        "table_dir", nargs="+", help="a recording folder with rewards/ (and profiles/); several: read as one"
    )
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
