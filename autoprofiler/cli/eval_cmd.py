"""``autoprofiler eval TASK CANDIDATE``: evaluate a candidate ModelNew against a task's Model in a
sandboxed worker; exit 0 when correct, 1 when not."""

from __future__ import annotations

import sys

from autoprofiler.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_INCORRECT,
    EXIT_OK,
    _load_eval_task,
    _resolve_device,
    _Stop,
    _task_size,
    add_size_option,
)


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
    add_size_option(p)
    p.add_argument("--trials", type=int, default=None, help="timing trials (default 100)")
    p.add_argument("--correctness-trials", type=int, default=None, help="correctness trials (default 5)")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the job (default 300)")
    p.add_argument("--json", action="store_true", help="print the EvalResult as JSON")
    p.set_defaults(func=_cmd_eval)


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
