"""``autoprofiler optimize TASK``: route by a tree, rewrite once, evaluate; one line per task as it
finishes, a summary that keeps tasks without a result apart, and the per-task table (``--out``)."""

from __future__ import annotations

import sys

from autoprofiler.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_INCORRECT,
    EXIT_OK,
    _Stop,
)
from autoprofiler.cli.tree_setup import (
    _add_tree_options,
    _environment_errors,
    _load_cli_tasks,
    _make_profiler,
    _resolve_tree_setup,
)
from autoprofiler.text import first_line


def _add_optimize(sub) -> None:
    p = sub.add_parser(
        "optimize",
        help="profile by a tree, rewrite once, evaluate",
        description="For TASK (a task file, or a folder/table of tasks): route through the tree, restrict "
        "the profile to the leaf's groups, rewrite once (rule-based or an OpenAI-compatible LLM), evaluate "
        "the candidate, print one line per task as it finishes and a summary that keeps tasks without a "
        "result apart. Exit 0 (a single task: when correct), 1 a single task's candidate is not correct or "
        "a task of a folder has no result, 2 bad input (also: a task without a recorded profile under "
        "--profiles), 3 environment. "
        "Example: autoprofiler optimize datasets/suite --rewriter rule --out bench/results/optimize.md",
    )
    p.add_argument("task", help="task file, or a folder (suite) / table of tasks")
    _add_tree_options(p)
    p.add_argument(
        "--rewriter", choices=("rule", "playbook", "openai"), default="rule", help="rewriter (default: rule)"
    )
    p.add_argument("--model", default=None, help="openai: model (default: AUTOPROFILER_LLM_MODEL)")
    p.add_argument("--base-url", default=None, help="openai: endpoint (default: AUTOPROFILER_LLM_BASE_URL)")
    p.add_argument("--target", choices=("cuda", "triton"), default="cuda", help="openai: what the LLM writes")
    p.add_argument("--trials", type=int, default=None, help="timing trials (default: the evaluator's)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per evaluation (default 300)")
    p.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="only tasks whose index in the sorted list is K mod N (split a suite over calls)",
    )
    p.add_argument(
        "--out",
        action="append",
        default=[],
        help="save the per-task table to a .md or .json file (repeatable)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="candidates evaluated at once (compilation and checks overlap; timing stays one at a time)",
    )
    p.add_argument(
        "--profiles",
        default=None,
        metavar="RECORDING",
        help="route on the profiles of a recording (workflows/oracle_sweep.py --out) instead of profiling "
        "again; the rows then show the recorded collection cost. The rewrite and evaluation stay live",
    )
    p.set_defaults(func=_cmd_optimize)


def _shard(tasks: list, spec: str | None) -> list:
    """The tasks of shard ``K/N`` (every N-th task from index K), or all of them."""
    if spec is None:
        return tasks
    try:
        k, n = (int(x) for x in spec.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        raise _Stop(EXIT_BAD_INPUT, f"--shard must be K/N with 0 <= K < N, got {spec!r}") from None
    return tasks[k::n]


def _make_rewriter(args):
    if args.rewriter in ("rule", "playbook"):
        from autoprofiler.rewriters import make_rewriter

        return make_rewriter(args.rewriter)
    from autoprofiler.rewriters.llm import LLMRewriter

    try:
        return LLMRewriter(base_url=args.base_url, model=args.model, target=args.target)
    except Exception as exc:  # missing model/key, openai not installed: the environment cannot run it
        raise _Stop(EXIT_ENVIRONMENT, f"cannot set up the openai rewriter: {exc}") from None


#: Failure kinds that mean a task's input was missing (exit 2 for a folder): no recorded profile, or a
#: task or profile that does not load.
INPUT_FAILURES = ("missing_profile", "profile_error", "task_error")


def _summary(results) -> dict:
    """KernelBench-style numbers over the tasks with a row (``analysis.summarize``); failures apart,
    counted by kind (``failures``)."""
    from collections import Counter

    from autoprofiler.analysis import summarize
    from autoprofiler.optimize import result_row

    rows = [result_row(r) for r in results]
    answered = [{**r, "profile_seconds": r["profile_s"], "missing": ""} for r in rows if not r["failed"]]
    summary = summarize(answered) if answered else {"tasks": 0}
    summary["failed"] = len(rows) - len(answered)
    summary["failures"] = dict(
        Counter(r["error_kind"] or "failed" for r in rows if r["failed"]).most_common()
    )
    return summary


def _format_row(row: dict, width: int = 40) -> str:
    """One task's outcome on one line: the tree's choice, the action, correct and speedup, or why not."""
    if row["correct"]:
        outcome = f"correct, speedup {row['speedup']:.3f}x" if row["speedup"] else "correct"
    else:
        kind = row["error_kind"] or "incorrect"
        reason = first_line(row["error"])
        if reason.startswith(f"{kind}:"):  # a failure's text starts with its kind already
            reason = reason[len(kind) + 1 :].strip()
        outcome = f"{'FAILED ' if row['failed'] else ''}{kind}: {reason}"
    if row["failed"] and not row["leaf"]:
        return f"{row['task']:<{width}} {outcome}"
    return (
        f"{row['task']:<{width}} leaf={row['leaf'] or '-':<10} groups={row['groups'] or '-'} "
        f"passes={row['passes']} profile={row['profile_s']:.1f}s action={row['action'] or '-'}  {outcome}"
    )


def _format_summary(s: dict) -> str:
    """The results of the evaluated tasks, then, apart, the tasks without a result (by kind)."""
    total = s.get("tasks", 0) + s["failed"]
    kinds = ", ".join(f"{k} {n}" for k, n in (s.get("failures") or {}).items())
    failed = (
        f"; {s['failed']} of {total} FAILED without a result ({kinds}), not counted in these numbers"
        if s["failed"]
        else ""
    )
    if not s.get("tasks"):
        return f"no task was evaluated (0 of {total}){failed}"
    return (
        f"{s['tasks']} of {total} tasks evaluated: correct {round(s['accuracy'] * s['tasks'])}/{s['tasks']} "
        f"({s['accuracy']:.0%}), geomean effective speedup {s['geomean_speedup']:.3f}x, "
        f"fast_1 {s['fast_1']:.0%}, fast_1.5 {s['fast_1.5']:.0%}, mean passes {s['passes_per_task']:.1f}, "
        f"mean profile {s['profile_seconds_per_task']:.1f} s, "
        f"LLM calls per task {s['llm_calls_per_task']:.2f}{failed}"
    )


def _write_table(path: str, rows: list[dict], summary: dict, config: dict) -> None:
    import json
    from pathlib import Path

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".json":
        out.write_text(json.dumps({"config": config, "summary": summary, "rows": rows}, indent=2) + "\n")
        return
    cols = ["task", "leaf", "groups", "passes", "profile_s", "action", "correct", "error_kind", "ref_ms",
            "new_ms", "speedup", "effective_speedup"]  # fmt: skip
    cell = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "/"))
    lines = [
        "# autoprofiler optimize",
        "",
        "```",
        json.dumps(config, indent=2),
        "```",
        "",
        _format_summary(summary),
        "",
        "| " + " | ".join(cols) + " |",
        "|" + " --- |" * len(cols),
    ]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    out.write_text("\n".join(lines) + "\n")


def _optimize_runner(args, setup: dict, rewriter, eval_options: dict):
    """In this process for ``--jobs 1``; else one Ray worker evaluating ``--jobs`` candidates at once.

    The tasks are profiled in this process (``policy.select_many``); the worker rewrites and evaluates.
    """
    from autoprofiler.runtime import CellWorker, LocalDriver, WorkerSpec

    spec = WorkerSpec(
        device=setup["device"],
        task_size=setup["size"],
        source=setup["source"],
        eval=eval_options,
        rewriter=args.rewriter,
        llm={"base_url": args.base_url, "model": args.model},
        rewriter_options={"target": args.target} if args.rewriter == "openai" else {},
        concurrency=args.jobs,
    )
    if args.jobs == 1:
        return LocalDriver(CellWorker(spec, rewriter=rewriter))
    from autoprofiler.runtime.ray_driver import RayDriver, init_ray

    try:
        init_ray()
        return RayDriver.start(spec, num_workers=1, progress=None)
    except Exception as exc:  # Ray does not start, or the cluster lacks the GPU asked for
        raise _Stop(
            EXIT_ENVIRONMENT,
            f"--jobs {args.jobs} runs one Ray worker, which did not start: {type(exc).__name__}: "
            f"{first_line(exc)}; try --jobs 1 (in this process)",
        ) from None


def _unrecorded(tasks: list, profiler, recording: str) -> list:
    """``Optimized`` failures for the tasks a recording holds no profile of (nothing to route on)."""
    from autoprofiler.optimize import Optimized

    return [
        Optimized(t, None, f"missing_profile: {recording} holds no profile of this task (hash {t.hash})")
        for t in tasks
        if not profiler.recorded_groups(t)
    ]


def _recorded_profiler(recording: str, setup: dict):
    """Profiles from a recording's table (``<recording>/profiles``), at their recorded cost."""
    from pathlib import Path

    from autoprofiler.environments import RecordedProfiler
    from autoprofiler.tables import ProfileTable

    table = Path(recording) / "profiles"
    if not table.is_dir():
        raise _Stop(EXIT_BAD_INPUT, f"--profiles {recording!r} has no profiles/ table (a recording folder?)")
    return RecordedProfiler(ProfileTable(table), source=setup["source"])


def _cmd_optimize(args) -> int:
    import datetime
    import json

    from autoprofiler.evaluation import EvalConfig, EvaluatorError
    from autoprofiler.optimize import optimize, result_row
    from autoprofiler.policies import TreePolicy
    from autoprofiler.runtime.progress import Progress

    try:
        for out in args.out:
            if not out.endswith((".md", ".json")):
                raise _Stop(EXIT_BAD_INPUT, f"--out must end in .md or .json, got {out!r}")
        if args.jobs < 1:
            raise _Stop(EXIT_BAD_INPUT, f"--jobs must be at least 1, got {args.jobs}")
        setup = _resolve_tree_setup(args)
        tasks = _shard(_load_cli_tasks(args.task, args.filter), args.shard)
        missing = []
        if args.profiles:
            profiler = _recorded_profiler(args.profiles, setup)
            missing = _unrecorded(tasks, profiler, args.profiles)
            if len(missing) == len(tasks):
                raise _Stop(
                    EXIT_BAD_INPUT,
                    f"--profiles {args.profiles} holds no {setup['source']} profile of any of the "
                    f"{len(tasks)} task(s); record them first (workflows/oracle_sweep.py) or pick recorded "
                    "ones with --filter",
                )
        else:
            profiler = _make_profiler(setup, args.cache)
        rewriter = _make_rewriter(args)
        policy = TreePolicy(setup["tree"])
        eval_options = {
            k: v for k, v in {"timing_trials": args.trials, "timeout_s": args.timeout}.items() if v
        }
        try:
            eval_config = EvalConfig(device=setup["device"], task_size=setup["size"], **eval_options)
        except ValueError as exc:
            raise _Stop(EXIT_BAD_INPUT, str(exc)) from None
        config = {
            "command": "optimize",
            "tasks": args.task,
            "filter": args.filter,
            "shard": args.shard,
            "tree": setup["tree_path"],
            "policy": policy.name,
            "source": setup["source"],
            "device": setup["device"],
            "size": setup["size"],
            "rewriter": rewriter.identity,
            "profiles": args.profiles,
            "jobs": args.jobs,
            "eval": eval_config.to_dict(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        many, width = len(tasks) > 1, max(len(t.id) for t in tasks)
        skipped = {m.task.hash for m in missing}
        todo = [t for t in tasks if t.hash not in skipped]
        if many and not args.json:
            if missing:
                names = ", ".join(m.task.id for m in missing[:3]) + (", ..." if len(missing) > 3 else "")
                print(
                    f"{len(missing)} of {len(tasks)} tasks have no profile in {args.profiles} ({names}): "
                    f"they fail with missing_profile; --filter picks the recorded ones",
                    file=sys.stderr,
                )
            print(
                f"optimizing {len(todo)} tasks: route by {setup['tree_path']} ({setup['source']}, "
                f"{'recorded profiles' if args.profiles else setup['device']}), rewrite "
                f"({rewriter.identity}), evaluate ({args.jobs} at once) ...",
                file=sys.stderr,
                flush=True,
            )
        runner = _optimize_runner(args, setup, rewriter, eval_options)
        with Progress(len(tasks), "optimize", enabled=many and not args.json, unit="task") as bar:

            def show(result) -> None:  # the one writer: each task's line as it is known, above the bar
                if not args.json:
                    bar.write(_format_row(result_row(result), width))
                bar.update(1)

            for result in missing:
                show(result)
            try:
                done = optimize(todo, policy, profiler, runner, rewriter, on_result=show) if todo else []
            except EvaluatorError as exc:
                raise _Stop(EXIT_ENVIRONMENT, str(exc)) from None
            except _environment_errors() as exc:
                raise _Stop(EXIT_ENVIRONMENT, str(exc)) from None
            finally:
                runner.close()
    except _Stop as stop:
        print(f"error: {stop}", file=sys.stderr)
        return stop.code
    by_hash = {r.task.hash: r for r in [*missing, *done]}
    results = [by_hash[t.hash] for t in tasks]
    rows = [result_row(r) for r in results]
    summary = _summary(results)
    if args.json:
        print(
            json.dumps(
                rows[0] if len(rows) == 1 else {"config": config, "summary": summary, "rows": rows},
                indent=2,
                default=str,
            )
        )
    elif many:
        print(_format_summary(summary))
    for out in args.out:
        _write_table(out, rows, summary, config)
        if not args.json:
            print(f"wrote {out}")
    return _optimize_exit(rows)


def _optimize_exit(rows: list[dict]) -> int:
    """2 when a task lacked its input (``INPUT_FAILURES``); else 1 when one has no result (or, for a single
    task, is not correct); else 0."""
    if any(r["failed"] and r["error_kind"] in INPUT_FAILURES for r in rows):
        return EXIT_BAD_INPUT
    if len(rows) == 1:
        return EXIT_OK if rows[0]["correct"] else EXIT_INCORRECT
    return EXIT_INCORRECT if any(r["failed"] for r in rows) else EXIT_OK
