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
    return p.parse_args(argv)


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
    started = time.monotonic()
    try:
        summary = record(tasks, env, [], {}, actions=actions, max_seconds=args.max_seconds)
        summary["provenance"] = env.runner_provenance().as_row()
    finally:
        env.close()
    wanted = {(t.hash, a) for t in tasks for a in actions}
    rows = [r for r in env.rewards.rows() if r.kind == "action" and (r.task_hash, r.action) in wanted]
    for r in sorted(rows, key=lambda r: (r.action, r.task_id)):
        speed = f"{r.speedup:.3f}x" if r.speedup else "-"
        print(
            f"{r.action:27s} {r.task_id:40s} {'ok ' if r.correct else 'BAD'} {speed:>8s} {r.error_kind or ''}"
        )
    summary.update(
        actions=actions,
        evaluated_now=summary["evaluations"],
        rows_for_these_actions=len(rows),
        expected=len(wanted),
        seconds=round(time.monotonic() - started, 1),
    )
    Path(args.recording, "playbook_record_summary.json").write_text(
        json.dumps(summary, indent=1, default=str)
    )
    print(
        f"rows for {len(actions)} action(s) x {len(tasks)} task(s): {len(rows)}/{len(wanted)}; evaluated "
        f"now: {summary['evaluations']}; failures: {len(summary['failures'])}; "
        f"complete: {summary['complete']}",
        flush=True,
    )
    if len(rows) < len(wanted):
        print("not every cell has a row yet: run the same command again to continue", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
