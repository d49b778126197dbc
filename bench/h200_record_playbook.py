"""Evaluate playbook actions on a suite and add them to a recording as action rows (GPU; resumable).

    python3 bench/h200_record_playbook.py --actions sdpa,cudnn_benchmark --recording datasets/h200_suite \
        --device cuda --jobs 6 --max-seconds 420

Each (task, action) is an action cell keyed by the candidate builders' version (``rule-v1``) and the
action's name, exactly like the five rule actions already recorded, so a ``ReplayEnvironment`` answers
the playbook's (and the experience rewriter's) choices of them afterwards and
``bench/rewriter_reachability.py`` gives them outcomes. Rows already in the recording are not evaluated
again: run the same command after a stop to continue. ``--max-seconds`` stops starting new evaluations
after that long. The evaluation settings default to those of the recorded rule actions (50 timing
trials, 3 correctness trials, 5 warm-up calls); ``--atol``/``--rtol`` evaluate at another tolerance,
which the reward key does not carry, so such rows must go to another ``--recording`` folder.

``--reachable REPORT.json`` (a ``bench/rewriter_reachability.py`` report of the same recording) evaluates
only the cells a rewriter can reach: a (task, action) pair is evaluated when ``--reachable-by`` (default
``playbook-v1``) decides that action for the task under at least one of the 1,024 group subsets. That is
every outcome a replay of that rewriter asks for, whatever the tree shows it; the per-task best over all
actions then lacks the unreachable ones. Tasks the report does not list get no cell (a note counts them).

Prints one line per evaluation and a summary; writes ``<recording>/playbook_record_summary.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.rewriters.actions import ACTIONS, RULE_ACTIONS  # noqa: E402

NEW_ACTIONS = [a for a in ACTIONS if a not in RULE_ACTIONS]


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actions", default=",".join(NEW_ACTIONS), help="comma-separated catalog actions")
    p.add_argument("--recording", default=str(ROOT / "datasets" / "h200_suite"))
    p.add_argument("--tasks", default=str(ROOT / "datasets" / "suite"))
    p.add_argument("--filter", default="", help="comma-separated task ids or suffixes (default: all)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--task-size", default="full", choices=("full", "small"))
    p.add_argument("--source", default="ncu", choices=("ncu", "torch"), help="provenance of the rows")
    p.add_argument("--jobs", type=int, default=6, help="candidates built and checked at once")
    p.add_argument("--timing-trials", type=int, default=50)
    p.add_argument("--correctness-trials", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--eval-timeout", type=float, default=120.0)
    p.add_argument("--atol", type=float, default=None)
    p.add_argument("--rtol", type=float, default=None)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--reachable", default=None, help="rewriter_reachability.py report: reachable cells only")
    p.add_argument("--reachable-by", default="playbook-v1", help="the report's rewriter whose reach counts")
    return p.parse_args(argv)


def reachable_actions(report: str | Path, rewriter: str) -> dict[str, set[str]]:
    """``task id -> actions`` that ``rewriter`` decides under some group subset, from a reachability report.

    Raises ValueError (one line) when the file is not such a report or lacks ``rewriter``.
    """
    try:
        data = json.loads(Path(report).read_text())
        results = {r["rewriter"]: r for r in data["results"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--reachable: {report} is not a rewriter_reachability.py report ({exc})") from None
    if rewriter not in results:
        raise ValueError(f"--reachable-by: {rewriter!r} is not in {report} (it has {', '.join(results)})")
    return {t["task"]: set(t["reachable"]) for t in results[rewriter]["per_task"]}


def plan_cells(task_ids: list[str], actions: list[str], reach: dict[str, set[str]] | None) -> dict:
    """``tuple of actions -> task ids``: the cells to evaluate, tasks grouped by the actions they need.

    Without ``reach`` every task needs every action (one group); with it, a task needs the ``actions``
    it can reach, in catalog order, and a task that needs none is left out.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for task_id in task_ids:
        wanted = tuple(a for a in actions if reach is None or a in reach.get(task_id, ()))
        if wanted:
            groups.setdefault(wanted, []).append(task_id)
    return groups


def problems(args: argparse.Namespace) -> list[str]:
    """One line per bad argument, found before any work starts."""
    out = []
    unknown = [a for a in args.actions.split(",") if a and a not in ACTIONS]
    if unknown or not [a for a in args.actions.split(",") if a]:
        out.append(f"--actions: {unknown or 'none given'} (known: {', '.join(ACTIONS)})")
    if args.jobs < 1:
        out.append(f"--jobs: expected an integer >= 1, got {args.jobs}")
    if not Path(args.tasks).exists():
        out.append(f"--tasks: {args.tasks} does not exist")
    if args.reachable is not None:
        try:
            reachable_actions(args.reachable, args.reachable_by)
        except ValueError as exc:
            out.append(str(exc))
    return out


def main(argv=None) -> int:
    args = parse(argv)
    bad = problems(args)
    if bad:
        for line in bad:
            print(f"error: {line}", file=sys.stderr)
        return 2
    from autoprofiler.environments import LiveEnvironment, record
    from autoprofiler.rewriters import PlaybookRewriter
    from autoprofiler.runtime import WorkerSpec
    from autoprofiler.workflow import EnvironmentProblem, configure_logging, make_runner, select_tasks

    configure_logging()
    actions = [a for a in args.actions.split(",") if a]
    names = [n for n in args.filter.split(",") if n]
    tasks, report, unmatched = select_tasks(args.tasks, names)
    if unmatched or not tasks:
        print(f"error: --filter {unmatched or names} matches no task in {args.tasks}", file=sys.stderr)
        return 2
    evaluation = {
        "timing_trials": args.timing_trials,
        "correctness_trials": args.correctness_trials,
        "warmup": args.warmup,
        "timeout_s": args.eval_timeout,
        "atol": args.atol,
        "rtol": args.rtol,
    }
    spec = WorkerSpec(
        device=args.device,
        task_size=args.task_size,
        source=args.source,
        eval=evaluation,
        rewriter="playbook",
        concurrency=args.jobs,
    )
    rewriter = PlaybookRewriter()
    try:
        runner = make_runner({"ray": False, "concurrency": args.jobs}, spec, rewriter=rewriter)
    except EnvironmentProblem as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 3
    env = LiveEnvironment(rewriter=rewriter, table_dir=args.recording, runner=runner, source=args.source)
    reach = reachable_actions(args.reachable, args.reachable_by) if args.reachable else None
    by_id = {t.id: t for t in tasks}
    unlisted = [i for i in by_id if reach is not None and i not in reach]
    if unlisted:  # a report older than the recording: say so, or its newest tasks silently get no cell
        print(
            f"note: {len(unlisted)} of {len(by_id)} tasks (first: {unlisted[0]}) are not in {args.reachable} "
            "and get no cell; rerun bench/rewriter_reachability.py on this recording to include them",
            flush=True,
        )
    cells = plan_cells(list(by_id), actions, reach)
    wanted = {(by_id[i].hash, a) for needed, ids in cells.items() for i in ids for a in needed}
    started = time.monotonic()
    summary = {"evaluations": 0, "failures": [], "not_started": 0, "complete": True}
    try:
        for needed, ids in cells.items():  # one record() per set of needed actions, within one budget
            left = None if args.max_seconds is None else args.max_seconds - (time.monotonic() - started)
            if left is not None and left <= 0:
                summary["complete"] = False
                break
            part = record([by_id[i] for i in ids], env, [], {}, actions=list(needed), max_seconds=left)
            failures = summary["failures"] + part["failures"]
            summary = {
                **part,
                "failures": failures,
                "not_started": summary["not_started"] + part["not_started"],
                "complete": summary["complete"] and part["complete"],
            }
        summary["provenance"] = env.runner_provenance().as_row()
    finally:
        env.close()
    rows = [r for r in env.rewards.rows() if r.kind == "action" and (r.task_hash, r.action) in wanted]
    for r in sorted(rows, key=lambda r: (r.action, r.task_id)):
        speed = f"{r.speedup:.3f}x" if r.speedup else "-"
        print(
            f"{r.action:27s} {r.task_id:40s} {'ok ' if r.correct else 'BAD'} {speed:>8s} {r.error_kind or ''}"
        )
    summary.update(
        actions=actions,
        reachable=args.reachable and f"{args.reachable} ({args.reachable_by})",
        evaluated_now=summary["evaluations"],
        rows_for_these_actions=len(rows),
        expected=len(wanted),
        seconds=round(time.monotonic() - started, 1),
    )
    Path(args.recording, "playbook_record_summary.json").write_text(
        json.dumps(summary, indent=1, default=str)
    )
    scope = "reachable cells" if reach is not None else f"{len(actions)} action(s) x {len(tasks)} task(s)"
    print(
        f"rows for {scope}: {len(rows)}/{len(wanted)}; evaluated now: {summary['evaluations']}; "
        f"failures: {len(summary['failures'])}; complete: {summary['complete']}",
        flush=True,
    )
    if len(rows) < len(wanted):
        print("not every cell has a row yet: run the same command again to continue", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
