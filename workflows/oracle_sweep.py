"""Record a suite (every task x every metric group, every rule action) and analyse the oracle sweep.

The recording is what the replay environment answers from; the analysis is the paper's Figure 2 /
Table 6 (each fixed configuration per task, best static, per-task oracle, wins, bootstrap CI).

On the H200 (writes datasets/h200_suite/; resumable: run it again to continue after a stop):

    python3 workflows/oracle_sweep.py --out datasets/h200_suite --source ncu --device cuda --max-seconds 540

On a CPU (torch.profiler source, small shapes):

    python workflows/oracle_sweep.py --out runs/cpu_suite --source torch --device cpu --task-size small \
        --tasks datasets/suite --filter matmul_square,relu --timing-trials 10

Analysis only, from existing tables (no GPU): ``--analyse-only`` (also writes the report when matplotlib
is installed; or ``python -m autoprofiler.report datasets/h200_suite --out reports/h200_suite``).

Imports only what the GPU machine has (torch, pyarrow, numpy, scipy): no ray, polars, openai or yaml.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # runs from a bare checkout too (the GPU machine has no install)
    sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the recording folder (profiles/, rewards/, candidates/)")
    p.add_argument("--tasks", default="datasets/suite", help="what autoprofiler.tasks.load_tasks reads")
    p.add_argument("--filter", default="", help="comma-separated task id suffixes (default: all)")
    p.add_argument("--max-tasks", type=int, default=0, help="0: all")
    p.add_argument("--source", choices=("ncu", "torch"), default="ncu")
    p.add_argument("--device", default="cuda")
    p.add_argument("--task-size", choices=("full", "small"), default="full")
    p.add_argument("--groups", default="", help="comma-separated groups (default: every group of the source)")
    p.add_argument("--timing-trials", type=int, default=100)
    p.add_argument("--correctness-trials", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--eval-timeout", type=float, default=300.0)
    p.add_argument("--seeds", default="0", help="comma-separated evaluation seeds")
    p.add_argument(
        "--jobs", type=int, default=1, help="candidates evaluated at once (timing stays exclusive)"
    )
    p.add_argument("--joint", action="store_true", help="all groups of a task in one profiled process")
    p.add_argument(
        "--evaluate-only",
        action="store_true",
        help="no profiling and no configuration rows: evaluate every rule action of every task (the replay "
        "environment derives each configuration's row from the recorded profiles and these)",
    )
    p.add_argument(
        "--range-replay-above",
        type=int,
        default=None,
        help="ncu: tasks whose root shows more kernels than this get their other groups by range replay",
    )
    p.add_argument("--joint-batch", type=int, default=8, help="tasks per joint profiled process (default 8)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop starting new work after this long")
    p.add_argument("--analyse-only", action="store_true", help="no recording: analyse the existing tables")
    p.add_argument("--report", default=None, help="report folder (default: <out>/report)")
    return p.parse_args(argv)


def load_suite(args):
    from autoprofiler.tasks import load_tasks

    spec = Path(args.tasks)
    report = load_tasks(spec if spec.is_absolute() else REPO / spec)
    tasks = list(report.tasks)
    if args.filter:
        wanted = {w.strip() for w in args.filter.split(",") if w.strip()}
        tasks = [t for t in tasks if t.id.split("/")[-1] in wanted or t.id in wanted]
    if args.max_tasks:
        tasks = tasks[: args.max_tasks]
    return tasks, report


def configurations_for(source: str) -> dict[str, tuple[str, ...]]:
    from autoprofiler.profiling import CONFIGURATIONS

    torch_names = {k for k in CONFIGURATIONS if k.startswith("torch_")}
    names = torch_names if source == "torch" else set(CONFIGURATIONS) - torch_names
    return {k: tuple(v) for k, v in CONFIGURATIONS.items() if k in names}


def record_suite(args, tasks, out: Path) -> dict:
    from autoprofiler.environments import LiveEnvironment, record
    from autoprofiler.evaluation import EvalConfig, Evaluator
    from autoprofiler.profiling import GROUPS, Profiler
    from autoprofiler.rewriters import RuleRewriter

    groups = [g.strip() for g in args.groups.split(",") if g.strip()] or [
        g for g, m in GROUPS.items() if m.source == args.source
    ]
    if args.evaluate_only:
        groups = []
    profiler = Profiler(
        source=args.source,
        device=args.device,
        task_size=args.task_size,
        range_replay_above=args.range_replay_above if args.source == "ncu" else None,
    )
    config = EvalConfig(
        device=args.device,
        task_size=args.task_size,
        timing_trials=args.timing_trials,
        correctness_trials=args.correctness_trials,
        warmup=args.warmup,
        timeout_s=args.eval_timeout,
        # with several jobs, compile and check concurrently but time one candidate at a time
        timing_lock=str(out / ".timing.lock") if args.jobs > 1 else None,
    )
    evaluator = Evaluator(config, spares=max(1, args.jobs))
    provenance = {}
    try:
        env_id = profiler.environment
        provenance = {"device": env_id.device, "driver": env_id.driver, "ncu_version": env_id.tool}
    except Exception as e:  # provenance is best effort; the rows still carry the evaluator's device
        logging.getLogger(__name__).warning("no profiler provenance: %s", e)
    env = LiveEnvironment(profiler, RuleRewriter(), evaluator, out, provenance=provenance)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        summary = record(
            tasks,
            env,
            groups,
            {} if args.evaluate_only else configurations_for(args.source),
            seeds=seeds,
            max_seconds=args.max_seconds,
            jobs=args.jobs,
            joint=args.joint,
            joint_batch=args.joint_batch,
        )
    finally:
        evaluator.close()
    summary["eval_config"] = config.to_dict()
    summary["provenance"] = provenance
    return summary


def write_readme(out: Path, args, summary: dict, oracle: dict, env) -> None:
    rows = env.rewards.rows()
    summary = {
        **summary,
        "tasks": len(env.recorded_tasks()),
        "groups": sorted({r["group"] for r in env.profiles.rows()}),
        "actions": sorted({r["action"] for r in rows if r["configuration"].startswith("action:")}),
        "profile_rows": len(env.profiles),
        "reward_rows": len(rows),
    }
    lines = [
        f"# {out.name}: a recorded suite (profile + reward tables)\n",
        f"Made by `python3 workflows/oracle_sweep.py {' '.join(sys.argv[1:])}` on "
        f"{_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC; replay it with "
        f"`ReplayEnvironment.from_dir('{out}', rewriter=RuleRewriter(), source='{args.source}')`.\n",
        f"- tasks with a recorded profile: {summary.get('tasks')}; "
        f"groups: {', '.join(summary.get('groups', []))}",
        f"- rule actions: {', '.join(summary.get('actions', []))}",
        f"- profile rows: {summary.get('profile_rows')}; reward rows: {summary.get('reward_rows')}; "
        f"evaluations in the last call: {summary.get('evaluations')}; complete: {summary.get('complete')}",
        f"- failures: {len(summary.get('failures', []))} (see summary.json)",
        f"- provenance: {summary.get('provenance')}\n",
        "Columns: `rewards/` follows `autoprofiler.rewards.REWARD_SCHEMA` (rows with configuration "
        "`action:<name>` hold one rule action's evaluation; other rows a configuration's, whose `action` "
        "is what the rule rewriter chose when shown those groups); `profiles/` follows "
        "`autoprofiler.reward_table.PROFILE_SCHEMA` (one row per task and group, the group's own cost and "
        "metrics as `Profile` JSON); `candidates/` holds every evaluated candidate source by hash.\n",
    ]
    if (out / "HISTORY.md").exists():
        lines.append("How it was recorded, call by call, and what it lacks: `HISTORY.md`.\n")
    if oracle.get("tasks"):
        lo, hi = oracle["relative_gain_ci"]
        lines.append(
            f"Oracle sweep over {oracle['tasks']} tasks: best static **{oracle['best_static']}** "
            f"{oracle['best_static_geomean']:.3f}x, oracle {oracle['oracle_geomean']:.3f}x, relative gain "
            f"{oracle['relative_gain']:.3f} (95% CI [{lo:.3f}, {hi:.3f}]); wins: "
            + ", ".join(f"{n} {c['wins']}" for n, c in oracle["per_configuration"].items())
            + ".\n"
        )
    (out / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    from autoprofiler.analysis import oracle_analysis, outcome_matrix
    from autoprofiler.environments import ReplayEnvironment, derive_configuration_rows
    from autoprofiler.rewriters import RuleRewriter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    out = Path(args.out)
    started = time.time()
    tasks, report = load_suite(args)
    print(f"{len(tasks)} tasks ({len(report.errors)} failed to load)", flush=True)
    summary_path = out / "summary.json"
    if args.analyse_only:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    else:
        summary = record_suite(args, tasks, out)
        summary_path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(f"recorded: {json.dumps({k: v for k, v in summary.items() if k != 'failures'}, default=str)}")
        for f in summary["failures"]:
            print(f"  failure: {f}")
    if not (out / "rewards").is_dir():  # stopped (max-seconds) before the first evaluation
        print(f"no reward rows yet under {out}: run the same command again to continue; nothing to analyse")
        return 0 if not summary.get("complete", True) else 1
    env = ReplayEnvironment.from_dir(out, rewriter=RuleRewriter(), source=args.source)
    recorded = env.recorded_tasks()
    derived = derive_configuration_rows(
        env, [t for t in tasks if t.hash in recorded], configurations_for(args.source)
    )
    print(
        f"configuration rows ({env.rewriter.identity}) derived from the recorded profiles and actions: "
        f"{derived['written']} new; {len({m['task_id'] for m in derived['missing']})} task(s) lack a group"
    )
    matrix = outcome_matrix([t for t in tasks if t.hash in recorded], configurations_for(args.source), env)
    oracle = oracle_analysis(matrix)
    (out / "oracle.json").write_text(json.dumps(oracle, indent=1, default=str) + "\n")
    if oracle.get("tasks"):
        print(
            f"oracle sweep: best static {oracle['best_static']} {oracle['best_static_geomean']:.3f}x, "
            f"oracle {oracle['oracle_geomean']:.3f}x, gain {oracle['relative_gain']:.3f} "
            f"CI {oracle['relative_gain_ci']}; wins "
            f"{ {n: c['wins'] for n, c in oracle['per_configuration'].items()} }"
        )
    write_readme(out, args, summary, oracle, env)
    try:
        from autoprofiler.report import build_report

        print(
            f"report: {build_report(out, args.report or out / 'report', title=f'suite recording {out.name}')}"
        )
    except ImportError as e:  # no matplotlib on the GPU machine: make the report later on a CPU
        print(f"no report ({e}); run: python -m autoprofiler.report {out} --out reports/{out.name}")
    print(f"done in {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
