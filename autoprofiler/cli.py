"""Command line: ``autoprofiler eval|profile|route|optimize ...``.

Each subcommand is a small function ``_cmd_<name>(args) -> int`` (the exit code). Exit codes:
0 success (for ``eval``: the candidate is correct), 1 the candidate was evaluated and is not correct,
2 bad input (a task or tree that does not load, a bad option), 3 an environment problem (no ncu, no GPU,
counters not permitted).
"""

from __future__ import annotations

import argparse
import logging
import sys

EXIT_OK, EXIT_INCORRECT, EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 0, 1, 2, 3


class _Stop(Exception):
    """A problem that ends the command with ``code`` after printing ``message``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _resolve_device(device: str) -> str:
    """``auto``: cuda when torch sees a CUDA device, else cpu; a ``cuda`` device torch cannot see stops."""
    if device == "auto" or device.startswith("cuda"):
        import torch

        if device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if not torch.cuda.is_available():
            raise _Stop(
                EXIT_ENVIRONMENT,
                f"--device {device} but torch sees no CUDA device here; run on a GPU machine, or pass "
                "--device cpu (with --source torch)",
            )
    return device


def _task_size(size: str, device: str) -> str:
    """``auto``: small on the CPU, full elsewhere."""
    return size if size != "auto" else ("small" if device == "cpu" else "full")


# --- eval --------------------------------------------------------------------------------------------
def _add_eval(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a candidate ModelNew against a task's Model",
        description="Evaluate CANDIDATE (a file defining ModelNew, or 'identity' for ModelNew = Model) "
        "against TASK (a KernelBench-form task file) in a sandboxed worker. Exit 0 when correct, 1 when "
        "not, 2 on bad input, 3 when the environment cannot run it. "
        "Example: autoprofiler eval datasets/suite/l1/relu.py identity --device cpu --size small",
    )
    p.add_argument("task", help="task file (.py defining Model, get_inputs, get_init_inputs)")
    p.add_argument("candidate", help="candidate file defining ModelNew, or 'identity'")
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto (cuda when available)")
    p.add_argument(
        "--size",
        choices=("auto", "full", "small"),
        default="auto",
        help="task size (AUTOPROFILER_TASK_SIZE); auto: full on CUDA, small on CPU",
    )
    p.add_argument("--trials", type=int, default=None, help="timing trials (default 100)")
    p.add_argument("--correctness-trials", type=int, default=None, help="correctness trials (default 5)")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the job (default 300)")
    p.add_argument("--json", action="store_true", help="print the EvalResult as JSON")
    p.set_defaults(func=_cmd_eval)


def _load_eval_task(path: str):
    """A Task from a file: ``tasks.load_task_file`` when present (it validates), else a plain read."""
    from autoprofiler import tasks

    loader = getattr(tasks, "load_task_file", None)
    if loader is not None:
        return loader(path)
    from pathlib import Path

    return tasks.Task.from_source(Path(path).stem, Path(path).read_text(), level=0, origin=str(path))


def _cmd_eval(args) -> int:
    import json
    from pathlib import Path

    from autoprofiler.evaluation import EvalConfig, Evaluator, EvaluatorError, TaskError, identity_candidate

    try:
        task = _load_eval_task(args.task)
    except Exception as exc:  # TaskLoadError, OSError: bad input either way
        print(f"error: task {args.task!r} does not load: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.candidate == "identity":
        candidate = identity_candidate(task.source)
    else:
        try:
            candidate = Path(args.candidate).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: cannot read candidate {args.candidate!r}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        device = _resolve_device(args.device)
    except _Stop as stop:
        print(f"error: {stop}", file=sys.stderr)
        return stop.code
    size = _task_size(args.size, device)
    overrides = {
        "timing_trials": args.trials,
        "correctness_trials": args.correctness_trials,
        "timeout_s": args.timeout,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        config = EvalConfig(device=device, task_size=size, **overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        with Evaluator(config, spares=0, fork_server=False) as evaluator:
            result = evaluator.evaluate(task, candidate)
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EvaluatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    if args.json:
        print(json.dumps({"task": task.id, "task_hash": task.hash, **result.to_dict()}, indent=2))
    else:
        print(f"{task.id} [{task.hash}] on {device} ({size}): {result.summary()}")
    return EXIT_OK if result.correct else EXIT_INCORRECT


# --- profile -----------------------------------------------------------------------------------------
def _add_profile(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="profile a task with metric groups and print a table",
        description="Collect metric GROUPS for TASK (a KernelBench-form file) with Nsight Compute "
        "(--source ncu, on a GPU) or torch.profiler (--source torch, CPU or GPU) and print metric, unit, "
        "value and the cost. Exit 2 on bad input or a failing program, 3 when ncu is missing or counters "
        "are not permitted. Example: autoprofiler profile datasets/suite/l1/relu.py "
        "--groups torch_root,torch_ops --source torch",
    )
    p.add_argument("task", help="task file (.py defining Model, get_inputs, get_init_inputs)")
    p.add_argument(
        "--groups", default=None, help="comma-separated metric groups (default: the source's root group)"
    )
    p.add_argument(
        "--config",
        default=None,
        help="a fixed configuration instead: algorithm|memory|latency|compute "
        "(torch_algorithm|... for --source torch)",
    )
    p.add_argument(
        "--source",
        choices=("auto", "ncu", "torch"),
        default="auto",
        help="auto: ncu when it is on PATH, else torch",
    )
    p.add_argument(
        "--device", default="auto", help="cpu | cuda | cuda:N | auto (cuda for ncu, else when available)"
    )
    p.add_argument(
        "--size",
        choices=("auto", "full", "small"),
        default="auto",
        help="task size (AUTOPROFILER_TASK_SIZE); auto: full on CUDA, small on CPU",
    )
    p.add_argument("--cache", default=None, help="ProfileCache directory (Parquet); none by default")
    p.add_argument("--ncu", default="ncu", help="ncu executable (default: ncu on PATH)")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds for the profiled process (default 600)"
    )
    p.add_argument("--top-kernels", type=int, default=5, help="kernels (operators) listed by time")
    p.add_argument("--json", action="store_true", help="print the Profile as JSON")
    p.set_defaults(func=_cmd_profile)


def _profile_table(profile, groups, top_kernels: int) -> str:
    """Rows of (group, metric, unit, value), then the top kernels and the cost."""
    from autoprofiler.profiling import GROUPS
    from autoprofiler.profiling.profile import TORCH_DURATION, format_value

    rows = [("group", "metric", "unit", "value")]
    for group in groups:
        for metric in GROUPS[group].metrics:
            value = format_value(profile.metrics.get(metric))
            rows.append((group, metric, profile.units.get(metric, ""), value))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----")
    duration, to_us = (TORCH_DURATION, 1.0) if profile.source == "torch" else ("gpu__time_duration.sum", 1e-3)
    kernels = sorted(profile.kernels, key=lambda k: -(k.get(duration) or 0.0))[:top_kernels]
    if kernels:
        lines.append("")
        lines.append("top " + ("operators" if profile.source == "torch" else "kernels") + " by time (us):")
        for k in kernels:
            took = format_value((k.get(duration) or 0.0) * to_us)
            lines.append(f"  {took:>10}  {str(k.get('name'))[:100]}")
    return "\n".join(lines)


def _cmd_profile(args) -> int:
    import json
    import shutil

    from autoprofiler.profiling import (
        CONFIGURATIONS,
        CountersNotPermitted,
        NcuNotFound,
        ProfileCache,
        Profiler,
        ProfilerError,
        resolve_groups,
    )

    try:
        task = _load_eval_task(args.task)
    except Exception as exc:  # TaskLoadError, OSError: bad input either way
        print(f"error: task {args.task!r} does not load: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    source = args.source
    if source == "auto":
        source = "ncu" if shutil.which(args.ncu) else "torch"
    device = args.device
    if device == "auto" and source == "ncu":
        device = "cuda"
    try:
        device = _resolve_device(device)
    except _Stop as stop:
        print(f"error: {stop}", file=sys.stderr)
        return stop.code
    if source == "ncu" and not device.startswith("cuda"):
        print(f"error: the ncu source needs a CUDA device, got --device {device}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    size = _task_size(args.size, device)
    root = "root" if source == "ncu" else "torch_root"
    try:
        if args.config is not None:
            if args.config not in CONFIGURATIONS:
                expected = sorted(CONFIGURATIONS)
                raise KeyError(f"unknown configuration {args.config!r}: expected one of {expected}")
            groups = resolve_groups(CONFIGURATIONS[args.config], source=source)
        else:
            groups = resolve_groups(args.groups or root, source=source)
        profiler = Profiler(
            source=source,
            device=device,
            cache=ProfileCache(args.cache) if args.cache else None,
            task_size=size,
            timeout_s=args.timeout,
            ncu_path=args.ncu,
        )
    except (KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        profile = profiler.collect(task, groups)
    except (NcuNotFound, CountersNotPermitted) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except ProfilerError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps({"task": task.id, **profile.restrict(groups).to_dict()}, indent=2))
        return EXIT_OK
    print(f"{task.id} [{task.hash}] {source} on {profile.device or device} ({size})")
    print(_profile_table(profile, groups, args.top_kernels))
    print(f"cost: {profile.passes} replay passes, {profile.seconds:.1f} s")
    return EXIT_OK


# --- route / optimize --------------------------------------------------------------------------------
_SEED_TREES = {"ncu": "seed.json", "torch": "seed_torch.json"}  # under trees/ at the repository root


def _add_tree_options(p) -> None:
    p.add_argument(
        "--tree",
        default=None,
        help="profiling tree JSON (default: trees/seed_torch.json, or trees/seed.json with --source ncu)",
    )
    p.add_argument(
        "--source",
        choices=("ncu", "torch"),
        default=None,
        help="profile source (default: the tree's; torch when no --tree is given)",
    )
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto (cuda when available)")
    p.add_argument(
        "--size",
        choices=("auto", "full", "small"),
        default="auto",
        help="task size (AUTOPROFILER_TASK_SIZE); auto: full on CUDA, small on CPU",
    )
    p.add_argument("--cache", default=None, help="profile cache folder (Parquet); default: no cache")
    p.add_argument(
        "--filter",
        default=None,
        metavar="NAMES",
        help="with a folder: only these tasks (comma-separated ids or id suffixes: relu,l2/swish_chain)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_route(sub) -> None:
    p = sub.add_parser(
        "route",
        help="route a task through a profiling tree",
        description="Route TASK through a profiling tree, collecting only what each node needs, and print "
        "the path (feature, value, threshold, direction), the leaf and what was collected. "
        "Example: autoprofiler route datasets/suite/l1/relu.py --tree trees/seed_torch.json",
    )
    p.add_argument("task", help="task file (or a folder / table of tasks: each is routed)")
    _add_tree_options(p)
    p.set_defaults(func=_cmd_route)


def _resolve_tree_setup(args) -> dict:
    """Load the tree (validated against the catalog) and resolve source, device and size."""
    from pathlib import Path

    from autoprofiler.profiling.groups import GROUPS
    from autoprofiler.tree import TreeError, load_tree

    source = args.source
    if args.tree is None:
        source = source or "torch"
        path = Path(__file__).resolve().parent.parent / "trees" / _SEED_TREES[source]
    else:
        path = Path(args.tree)
    try:
        tree = load_tree(path, catalog=GROUPS)
    except (TreeError, OSError) as exc:
        raise _Stop(EXIT_BAD_INPUT, f"tree {str(path)!r} does not load: {exc}") from None
    source = source or tree.source
    if tree.source != source:
        raise _Stop(
            EXIT_BAD_INPUT, f"--tree {path} routes on {tree.source!r} features but --source is {source!r}"
        )
    device = _resolve_device(args.device)
    if source == "ncu" and not device.startswith("cuda"):
        raise _Stop(EXIT_ENVIRONMENT, f"the ncu source needs a CUDA device, got --device {device}")
    size = _task_size(args.size, device)
    try:  # the shipped default, shown as a user would type it
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return {"tree": tree, "tree_path": shown, "source": source, "device": device, "size": size}


def _load_cli_tasks(spec: str, names: str | None = None) -> list:
    """The tasks of a file, folder or table; ``names``: comma-separated ids or id suffixes to keep."""
    from autoprofiler.tasks import TaskLoadError
    from autoprofiler.workflow import select_tasks

    wanted = [n.strip() for n in (names or "").split(",") if n.strip()]
    try:
        tasks, report, unmatched = select_tasks(spec, wanted)
    except TaskLoadError as exc:
        raise _Stop(EXIT_BAD_INPUT, f"tasks {spec!r} do not load: {' '.join(str(exc).split())}") from None
    for error in report.errors:
        print(f"warning: skipped {error}", file=sys.stderr)
    if unmatched:
        raise _Stop(EXIT_BAD_INPUT, f"--filter: {', '.join(unmatched)} match no task in {spec}")
    if not tasks:
        raise _Stop(EXIT_BAD_INPUT, f"no task loaded from {spec!r}")
    return tasks


def _make_profiler(setup: dict, cache: str | None):
    from autoprofiler.profiling import Profiler

    kwargs = {"source": setup["source"], "device": setup["device"], "task_size": setup["size"]}
    if cache:
        from autoprofiler.profiling.cache import ProfileCache

        kwargs["cache"] = ProfileCache(cache)
    try:
        return Profiler(**kwargs)
    except ValueError as exc:  # a bad --device and the like
        raise _Stop(EXIT_BAD_INPUT, str(exc)) from None


def _recorded_profiler(recording: str, setup: dict):
    """Profiles from a recording's table (``<recording>/profiles``), at their recorded cost."""
    from pathlib import Path

    from autoprofiler.environments import RecordedProfiler
    from autoprofiler.tables import ProfileTable

    table = Path(recording) / "profiles"
    if not table.is_dir():
        raise _Stop(EXIT_BAD_INPUT, f"--profiles {recording!r} has no profiles/ table (a recording folder?)")
    return RecordedProfiler(ProfileTable(table), source=setup["source"])


def _environment_errors() -> tuple[type, ...]:
    """Profiler errors that stop the whole command (no ncu, no counter permission): exit 3."""
    from autoprofiler.profiling import CountersNotPermitted, NcuNotFound

    return (NcuNotFound, CountersNotPermitted)


def _format_route(task, route, setup: dict) -> str:
    lines = [
        f"task   {task.id} [{task.hash}]",
        f"tree   {setup['tree_path']} ({setup['source']}, {setup['device']}, size {setup['size']})",
    ]
    for step in route.path:
        sign = "<=" if step.went == "left" else "> "
        lines.append(
            f"  {step.node:<10} {step.feature} = {step.value:.4g} {sign} {step.threshold:g} -> {step.went}"
        )
    lines.append(f"leaf   {route.leaf}: {', '.join(route.leaf_groups) or '(none)'}")
    lines.append(
        f"cost   collected {', '.join(route.groups) or 'nothing'}: "
        f"{route.passes} passes, {route.seconds:.2f} s"
    )
    return "\n".join(lines)


def _route_line(task, route, width: int) -> str:
    """One task's routing on one line: the leaf, the direction taken at each node, the cost."""
    turns = ", ".join(f"{s.node} {'<=' if s.went == 'left' else '>'}" for s in route.path) or "root is a leaf"
    return (
        f"{task.id:<{width}}  leaf {route.leaf:<10} ({turns})  collected {len(route.groups)} groups, "
        f"{route.passes} passes, {route.seconds:.2f} s"
    )


def _route_summary(leaves: list[str], errors: int, setup: dict, seconds: float, passes: int) -> str:
    """``45 tasks routed by trees/x.json: algorithm 20, compute 10; 0 errors; ...``."""
    from collections import Counter

    counts = ", ".join(f"{leaf} {n}" for leaf, n in Counter(leaves).most_common()) or "none"
    n = len(leaves)
    cost = f"; mean {seconds / n:.2f} s and {passes / n:.1f} passes per task" if n else ""
    return f"{n} tasks routed by {setup['tree_path']}: {counts}; {errors} failed{cost}"


def _cmd_route(args) -> int:
    import json

    from autoprofiler.tree import RouteError

    try:
        setup = _resolve_tree_setup(args)
        tasks = _load_cli_tasks(args.task, args.filter)
        profiler = _make_profiler(setup, args.cache)
        many = len(tasks) > 1
        if many and not args.json:
            print(
                f"routing {len(tasks)} tasks by {setup['tree_path']} ({setup['source']}, {setup['device']}, "
                f"size {setup['size']}): one profiled process per tree level ...",
                file=sys.stderr,
                flush=True,
            )
        code, leaves, errors, seconds, passes = EXIT_OK, [], 0, 0.0, 0
        width = max(len(t.id) for t in tasks)
        for task, route in zip(tasks, setup["tree"].route_many(tasks, profiler), strict=True):
            if isinstance(route, _environment_errors()):
                raise _Stop(EXIT_ENVIRONMENT, str(route))
            if isinstance(route, Exception):
                print(f"error: {task.id}: {_one_line(str(route))}", file=sys.stderr)
                code = EXIT_BAD_INPUT if isinstance(route, RouteError) else EXIT_ENVIRONMENT
                errors += 1
                continue
            leaves.append(route.leaf)
            seconds, passes = seconds + route.seconds, passes + route.passes
            if args.json:
                steps = [s._asdict() for s in route.path]
                print(
                    json.dumps(
                        {
                            "task": task.id,
                            "task_hash": task.hash,
                            "leaf": route.leaf,
                            "path": steps,
                            "leaf_groups": list(route.leaf_groups),
                            "collected": list(route.groups),
                            "passes": route.passes,
                            "seconds": route.seconds,
                        }
                    )
                )
            elif many:
                print(_route_line(task, route, width), flush=True)
            else:
                print(_format_route(task, route, setup))
        if many and not args.json:
            print(_route_summary(leaves, errors, setup, seconds, passes))
        return code
    except _Stop as stop:
        print(f"error: {stop}", file=sys.stderr)
        return stop.code


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


def _one_line(text: str, limit: int = 300) -> str:
    """The first line of ``text``, cut at a word boundary (never inside a hash or a path) past ``limit``."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    if len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit)
    return line[: cut if cut > 0 else limit] + " ..."


def _format_row(row: dict, width: int = 40) -> str:
    """One task's outcome on one line: the tree's choice, the action, correct and speedup, or why not."""
    if row["correct"]:
        outcome = f"correct, speedup {row['speedup']:.3f}x" if row["speedup"] else "correct"
    else:
        kind = row["error_kind"] or "incorrect"
        reason = _one_line(row["error"] or "")
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
            f"{_one_line(str(exc))}; try --jobs 1 (in this process)",
        ) from None


def _unrecorded(tasks: list, profiler, recording: str) -> list:
    """``Optimized`` failures for the tasks a recording holds no profile of (nothing to route on)."""
    from autoprofiler.optimize import Optimized

    return [
        Optimized(t, None, f"missing_profile: {recording} holds no profile of this task (hash {t.hash})")
        for t in tasks
        if not profiler.recorded_groups(t)
    ]


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


# -----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoprofiler", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_eval, _add_profile, _add_route, _add_optimize):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
