"""``autoprofiler route TASK``: route tasks through a profiling tree, collecting only what each node
needs, and print the path, the leaf and what was collected (one line per task for a folder)."""

from __future__ import annotations

import sys

from autoprofiler.cli.common import EXIT_BAD_INPUT, EXIT_ENVIRONMENT, EXIT_OK, _Stop
from autoprofiler.cli.tree_setup import (
    _add_tree_options,
    _environment_errors,
    _load_cli_tasks,
    _make_profiler,
    _resolve_tree_setup,
)
from autoprofiler.text import first_line


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
                print(f"error: {task.id}: {first_line(route)}", file=sys.stderr)
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
