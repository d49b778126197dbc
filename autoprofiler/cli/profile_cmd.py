"""``autoprofiler profile TASK``: collect metric groups for one task (Nsight Compute or torch.profiler)
and print metric, unit, value, the top kernels and the cost."""

from __future__ import annotations

import sys

from autoprofiler.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_OK,
    _load_eval_task,
    _resolve_device,
    _Stop,
    _task_size,
    add_size_option,
)


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
    add_size_option(p)
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
