"""Record a suite (every task x every metric group, every rule action) and analyse the oracle sweep.

The recording is what the replay environment answers from; the analysis is the paper's Figure 2 /
Table 6 (each fixed configuration per task, best static, per-task oracle, wins, bootstrap CI).

Run (embedded default: two suite tasks on CPU with torch.profiler, GpuWorker actors on a local Ray):

    python workflows/oracle_sweep.py
    python workflows/oracle_sweep.py --config workflows/oracle_sweep.yaml key=value ...   # dotted for nesting
    python workflows/oracle_sweep.py out_dir=runs/rec filter='[relu, softmax_rows]' runtime.ray=false

On the H200 (no Ray there: in this process; resumable: after a stop, ``--resume`` continues it):

    python3 workflows/oracle_sweep.py --config workflows/oracle_sweep_h200.yaml max_seconds=540 --resume

On a Ray cluster (docs/cluster.md):

    ray job submit --working-dir . -- python workflows/oracle_sweep.py out_dir=/shared/rec ...

Analysis only, from tables already recorded (no GPU): ``analyse_only=true``.

An ``out_dir`` that already holds a recording is refused unless ``--resume`` (continue it; every row
is keyed, so nothing is evaluated twice) or ``--overwrite`` (delete it first). Exit codes: 0 done, 2 a
config problem (one line each, before any work), 3 the machine cannot run it (no CUDA, no ncu, Ray).

Outputs in ``out_dir``: ``profiles/``, ``rewards/``, ``candidates/`` (Parquet, partitioned by run),
``config.json`` (this call's resolved config and provenance), ``summary.json`` (this call's counts and
failures), ``oracle.json``, ``README.md`` and ``report/`` (``report_dir``). Recording needs torch and
pyarrow only; the analysis needs polars (and matplotlib for the report) and says how to run it elsewhere
when they are missing.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a bare checkout (the GPU machine, ray job submit --working-dir .) runs it too
    sys.path.insert(0, str(REPO))

from autoprofiler.runtime.progress import stage  # noqa: E402
from autoprofiler.workflow import (  # noqa: E402
    EnvironmentProblem,
    config_line,
    configure_logging,
    environment_problem,
    load_config,
    make_runner,
    out_dir_problems,
    prepare_out_dir,
    resolve_path,
    run_main,
    save_config,
    select_tasks,
    task_problems,
    worker_problems,
    worker_spec,
)

CONFIG_PATH = Path(__file__).with_name("oracle_sweep.yaml")
NESTED = ("rewriter_options", "eval", "runtime")  # sections that take dotted overrides
SHOWN = ("tasks", "filter", "source", "device", "task_size", "groups", "actions", "joint")


def _source_groups(source: str) -> list[str]:
    from autoprofiler.profiling import GROUPS

    return [g for g, m in GROUPS.items() if m.source == source]


def configurations_for(source: str, names: list[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The fixed configurations (``profiling.CONFIGURATIONS``) of one profile source (``names``: those)."""
    from autoprofiler.profiling import CONFIGURATIONS

    torch_names = {k for k in CONFIGURATIONS if k.startswith("torch_")}
    mine = torch_names if source == "torch" else set(CONFIGURATIONS) - torch_names
    wanted = mine if names is None else set(names)
    return {k: tuple(v) for k, v in CONFIGURATIONS.items() if k in mine and k in wanted}


def check(cfg: dict) -> list[str]:
    """Problems with values and paths, found before any work starts."""
    from autoprofiler.rewriters import RuleRewriter

    problems = worker_problems(cfg)
    problems += task_problems(
        resolve_path(cfg["tasks"]) if isinstance(cfg["tasks"], str) else None, cfg["filter"], cfg["max_tasks"]
    )
    if isinstance(cfg["groups"], list) and cfg["source"] in ("ncu", "torch"):
        unknown = [g for g in cfg["groups"] if g not in _source_groups(cfg["source"])]
        if unknown:
            known = ", ".join(_source_groups(cfg["source"]))
            problems.append(f"groups: {unknown} are not {cfg['source']} groups (known: {known})")
    if isinstance(cfg["configurations"], list) and cfg["source"] in ("ncu", "torch"):
        known = ", ".join(configurations_for(cfg["source"]))
        unknown = [c for c in cfg["configurations"] if c not in configurations_for(cfg["source"])]
        if unknown:
            problems.append(f"configurations: {unknown} are not of source {cfg['source']} (known: {known})")
    if isinstance(cfg["actions"], list):
        unknown = [a for a in cfg["actions"] if a not in RuleRewriter.actions()]
        if unknown:
            problems.append(f"actions: {unknown} are not rule actions (known: {RuleRewriter.actions()})")
    seeds = cfg["seeds"]
    if isinstance(seeds, list) and (not seeds or not all(type(s) is int for s in seeds)):
        problems.append(f"seeds: expected a non-empty list of integers, got {cfg['seeds']!r}")
    if isinstance(cfg["joint_batch"], int) and cfg["joint_batch"] < 1:
        problems.append(f"joint_batch: expected an integer >= 1, got {cfg['joint_batch']!r}")
    if cfg["chunk"] is not None and (type(cfg["chunk"]) is not int or cfg["chunk"] < 1):
        problems.append(f"chunk: expected null or an integer >= 1, got {cfg['chunk']!r}")
    if cfg["analyse_only"] is True and isinstance(cfg["out_dir"], str):
        if not (Path(cfg["out_dir"]) / "rewards").is_dir():
            problems.append(f"analyse_only: {cfg['out_dir']!r} holds no recording (no rewards/ folder)")
    return problems


def read_config(argv: list[str], claim: bool = False) -> dict:
    """oracle_sweep.yaml, then ``--config FILE``, then ``key=value`` overrides; raises ``ConfigError``.

    ``claim``: also refuse an ``out_dir`` that holds a recording already, unless ``--resume`` (continue
    it: every row is keyed) or ``--overwrite`` (``analyse_only`` reads the recording there: never refused).
    """

    def checks(cfg: dict) -> list[str]:
        return check(cfg) + (out_dir_problems(cfg) if claim and cfg["analyse_only"] is not True else [])

    return load_config(CONFIG_PATH, argv, NESTED, checks, __doc__)


# --- recording ----------------------------------------------------------------------------------------
def record_suite(cfg: dict, tasks: list, out: Path) -> dict:
    """Record ``tasks`` into ``out`` through the configured runtime; returns ``record``'s summary."""
    from autoprofiler.environments import LiveEnvironment, record
    from autoprofiler.rewriters import RuleRewriter

    rewriter = RuleRewriter(**(cfg["rewriter_options"] or {}))
    runner = make_runner(cfg["runtime"], worker_spec(cfg), rewriter=rewriter)
    env = LiveEnvironment(rewriter=rewriter, table_dir=out, runner=runner, source=cfg["source"])
    only_actions = cfg["evaluate_only"]
    try:
        summary = record(
            tasks,
            env,
            [] if only_actions else (cfg["groups"] or _source_groups(cfg["source"])),
            {} if only_actions else configurations_for(cfg["source"], cfg["configurations"]),
            seeds=cfg["seeds"],
            max_seconds=cfg["max_seconds"],
            joint=cfg["joint"],
            joint_batch=cfg["joint_batch"],
            chunk=cfg["chunk"],
            actions=cfg["actions"] or None,
        )
        summary["provenance"] = env.runner_provenance().as_row()
        summary["run_id"] = env.run_id
    finally:
        env.close()
    return summary


# --- analysis -----------------------------------------------------------------------------------------
def write_readme(out: Path, cfg: dict, argv: list[str], summary: dict, oracle: dict) -> Path:
    """``out/README.md``: what the recording holds (counted from its tables), how it was made and what
    its columns mean (reward schema 2), and the oracle sweep's result."""
    from autoprofiler.rewards import SCHEMA_VERSION
    from autoprofiler.tables import read_table

    rewards = read_table(out / "rewards", "reward").to_pylist()
    profiles = read_table(out / "profiles", "profile").to_pylist() if (out / "profiles").is_dir() else []
    kinds = {k: sum(r["kind"] == k for r in rewards) for k in ("action", "configuration")}
    actions = sorted({r["action"] for r in rewards if r["kind"] == "action"})
    command = " ".join(["python workflows/oracle_sweep.py", *argv])
    lines = [
        f"# {out.name}: a recorded suite (profile + reward tables)\n",
        f"Written by `{command}` on {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC (the last recording "
        "call's resolved config: `config.json`). Replay it with "
        f"`ReplayEnvironment('{out}', RuleRewriter(), source='{cfg['source']}')`.\n",
        f"- tasks with a recorded profile: {len({p['task_hash'] for p in profiles})}; "
        f"groups: {', '.join(sorted({p['group'] for p in profiles})) or 'none'}",
        f"- rule actions evaluated: {', '.join(actions) or 'none'}",
        f"- profile rows: {len(profiles)}; reward rows: {len(rewards)} ({kinds['action']} action, "
        f"{kinds['configuration']} configuration)",
        f"- the last recording call (`summary.json`): {summary.get('evaluations', 0)} evaluations, "
        f"{len(summary.get('failures', []))} failures, complete: {summary.get('complete')}; its workers' "
        f"provenance: {summary.get('provenance')}\n",
        f"Columns: `rewards/` follows `autoprofiler.rewards.REWARD_SCHEMA` (schema version {SCHEMA_VERSION}, "
        "tagged in every part's metadata). `kind` says what a row is: `action`, one rule action's "
        "candidate evaluated whatever a profile says (`action` names it, `configuration` is empty, "
        "`rewriter` is the candidate builders' version, e.g. `rule-v1`); or `configuration`, what the "
        "rule rewriter did when shown a fixed configuration's groups (`configuration` names the groups, "
        "`action` is what its rules chose, `rewriter` is its identity, e.g. `rule-v2`). `policy` says what "
        "asked for the row (`action`, `static:<configuration name>`). Every row carries its provenance "
        "(device, driver, ncu_version, torch_version, git_sha, git_dirty, run_id, worker). `profiles/` "
        "follows `autoprofiler.tables.PROFILE_SCHEMA` (one row per task and group: the group's own cost "
        "and its metrics as `Profile` JSON); `candidates/` holds every evaluated candidate source by hash. "
        "Parts are partitioned by run: `<table>/run=<run id>/part-*.parquet`.\n",
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
    else:
        skipped = oracle.get("skipped")
        lines.append(f"No oracle sweep: no task has a row for every configuration (skipped: {skipped}).\n")
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


def analyse(cfg: dict, argv: list[str], tasks: list, out: Path, summary: dict) -> None:
    """Derive configuration rows the recording implies, the oracle analysis, README.md and the report."""
    try:
        from autoprofiler.analysis import oracle_analysis, outcome_matrix
    except ImportError as exc:  # a GPU image without polars: analyse on another machine
        print(
            f"no analysis here ({exc}); on a machine with the package installed run: python "
            f"workflows/oracle_sweep.py out_dir={out} source={cfg['source']} analyse_only=true",
            flush=True,
        )
        return
    from autoprofiler.environments import ReplayEnvironment, derive_configuration_rows, new_run_id
    from autoprofiler.rewriters import RuleRewriter
    from autoprofiler.tables import RewardTable

    if not (out / "profiles").is_dir():  # evaluate_only: the actions' rows, and no profile to route on
        summarise_actions(out)
        return
    configs = configurations_for(cfg["source"], cfg["configurations"])
    env = ReplayEnvironment(out, RuleRewriter(**(cfg["rewriter_options"] or {})), cfg["source"])
    recorded = [t for t in tasks if t.hash in env.recorded_tasks()]
    derived = derive_configuration_rows(
        env, recorded, configs, into=RewardTable(out / "rewards", run_id=new_run_id()), seeds=cfg["seeds"]
    )
    lacking = len({m["task_id"] for m in derived["missing"]})
    print(
        f"configuration rows ({env.rewriter.identity}) derived from the recorded profiles and actions: "
        f"{derived['written']} new; {lacking} task(s) lack a group or an action",
        flush=True,
    )
    oracle = oracle_analysis(outcome_matrix(recorded, configs, env))
    (out / "oracle.json").write_text(json.dumps(oracle, indent=1, default=str) + "\n")
    if oracle.get("tasks"):
        wins = {n: c["wins"] for n, c in oracle["per_configuration"].items()}
        print(
            f"oracle sweep over {oracle['tasks']} tasks: best static {oracle['best_static']} "
            f"{oracle['best_static_geomean']:.3f}x, oracle {oracle['oracle_geomean']:.3f}x, gain "
            f"{oracle['relative_gain']:.3f} CI {oracle['relative_gain_ci']}; wins {wins}",
            flush=True,
        )
    print(f"readme: {write_readme(out, cfg, argv, summary, oracle)}", flush=True)
    report_dir = Path(cfg["report_dir"]) if cfg["report_dir"] else out / "report"
    try:
        from autoprofiler.report import build_report

        path = build_report(out, report_dir, title=f"suite recording {out.name}")
        print(f"report: {path}", flush=True)
    except ImportError as exc:  # no matplotlib on the GPU machine: make the report on a CPU
        print(f"no report ({exc}); run: python -m autoprofiler.report {out} --out {report_dir}", flush=True)


def summarise_actions(out: Path) -> None:
    """Per rule action: tasks, correct share and geomean speedup (a recording without profiles)."""
    import polars as pl

    from autoprofiler.analysis import outcome_frame, reward_frame, summary_frame

    rows = reward_frame(out / "rewards").filter(pl.col("kind") == "action").sort("action")
    by_action = summary_frame(outcome_frame(rows.to_dicts(), keys=["action"]), by=["action"])
    print(f"no profiles under {out} (evaluate_only): no oracle analysis; the rule actions:", flush=True)
    for r in by_action.iter_rows(named=True):
        print(
            f"  {r['action']}: {r['tasks']} tasks, {r['accuracy']:.0%} correct, geomean speedup "
            f"{r['geomean_speedup']:.3f}x",
            flush=True,
        )


def _left_for_resume(not_started: int) -> str:
    """``, 23 action cells the time budget left for --resume``: what it stopped before it began."""
    return f", {not_started} action cells the time budget left for --resume" if not_started else ""


# --- the story ----------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    configure_logging()
    started = time.time()
    cfg = read_config(argv, claim=True)
    if not cfg["analyse_only"]:
        problem = environment_problem(cfg["device"], cfg["source"], cfg["runtime"])
        if problem:
            raise EnvironmentProblem(problem)
    out = Path(cfg["out_dir"])
    source = resolve_path(cfg["tasks"])
    tasks, report, _ = select_tasks(source, cfg["filter"], cfg["max_tasks"])
    where = f"from {source.resolve()} ({len(report.errors)} failed to load)"
    print(f"tasks: {len(tasks)} {where}; recording: {out}", flush=True)

    # 1. record (resumable: every row is keyed), unless only analysing
    summary_path = out / "summary.json"
    if cfg["analyse_only"]:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    else:
        prepare_out_dir(cfg)
        print(config_line(save_config(out, cfg), cfg, SHOWN), flush=True)
        with stage("recording"):
            summary = record_suite(cfg, tasks, out)
        summary_path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
        print(
            f"recorded in {summary['seconds']:.0f} s: {summary['profile_rows']} profile rows, "
            f"{summary['reward_rows']} reward rows ({summary['evaluations']} new evaluations), "
            f"{len(summary['failures'])} failures{_left_for_resume(summary['not_started'])} "
            f"(all counts: {summary_path})",
            flush=True,
        )
        for failure in summary["failures"]:
            print(f"  failure: {failure['task_id']} {failure['stage']}: {failure['error'][:200]}", flush=True)
        if not summary["complete"]:
            print("stopped before the end (max_seconds): run the same command with --resume to continue")
    if not (out / "rewards").is_dir():  # stopped before the first evaluation
        print(f"no reward rows yet under {out}: run the same command with --resume to continue")
        return 0

    # 2. analyse what the recording holds
    analyse(cfg, argv, tasks, out, summary)
    print(f"done in {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
