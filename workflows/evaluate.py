"""Judge policies on held-out tasks: blind, the fixed configurations, random, one or more trees, the oracle.

Every policy picks what to show the rewriter for every judged task; all their cells then go to the
environment at once (a replay of a recording, or live workers that evaluate what the recording lacks),
and each policy is summarised the KernelBench way (geomean effective speedup, accuracy, fast_p, profiling
passes). This is ``workflows/train.py``'s judging step on its own, for trees learned elsewhere.

Run (embedded default: the seed tree replayed on the H200 recording's held-out tasks; no GPU):

    python workflows/evaluate.py
    python workflows/evaluate.py --config workflows/evaluate.yaml key=value ...   # dotted for nesting
    python workflows/evaluate.py trees='[runs/train-cpu/tree.json]' environment=live tables=null \
        source=torch probe='[torch_algorithm, torch_memory, torch_latency, torch_compute]' split=all \
        filter='[relu, softmax_rows, layernorm]' out_dir=runs/eval-cpu

Several recordings and task sources (a path or a list of paths each; as in ``workflows/train.py``: the
replay reads their union, tasks are merged by id, and it judges the tasks the recordings answer in full,
one line per recording saying how many and why the others were left out):

    python workflows/evaluate.py tables='[datasets/h200_suite, datasets/recorded/h200]' \
        tasks='[datasets/suite, datasets/ops_gen/tasks.parquet]' out_dir=runs/eval-both

On a Ray cluster (docs/cluster.md):

    ray job submit --working-dir . -- python workflows/evaluate.py out_dir=/shared/eval ...

Outputs in ``out_dir`` (one that already holds a run is refused unless ``--overwrite``/``overwrite=true``,
which deletes it first, or ``--resume``, which reuses its tables; exit 2, like every config problem):
``config.json`` (resolved config and provenance), ``evaluation.json`` (per (policy, task) rows, per-policy
summaries, the comparison of each tree with the best static configuration and the oracle; on a replay
the recordings and task sources used, with their counts), ``tasks_left_out.json`` (a replay's) and
``report/report.md`` (+ PNGs). A live run also keeps its rows in ``tables`` (default ``out_dir/tables``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a bare checkout (ray job submit --working-dir .) runs it too
    sys.path.insert(0, str(REPO))

from autoprofiler.runtime.progress import stage  # noqa: E402
from autoprofiler.workflow import (  # noqa: E402
    CONFIG_REWRITERS,
    ConfigError,
    EnvironmentProblem,
    config_line,
    config_rewriter,
    configure_logging,
    environment_problem,
    load_config,
    make_runner,
    prepare_out_dir,
    probe_problems,
    resolve_path,
    run_main,
    save_config,
    select_tasks,
    task_problems,
    worker_problems,
    worker_spec,
)
from autoprofiler.workflow_sources import (  # noqa: E402
    path_list,
    replay_tasks,
    tables_problems,
)

CONFIG_PATH = Path(__file__).with_name("evaluate.yaml")
NESTED = ("rewriter_options", "llm", "eval", "runtime")  # sections that take dotted overrides
PATHS = ("tables", "tasks")  # a path or a list of paths
ENVIRONMENTS = ("replay", "live")
SPLITS = ("test", "train", "all")
SHOWN = ("environment", "tables", "tasks", "filter", "split", "source", "trees", "probe")


def tree_names(paths: list[str]) -> dict[str, Path]:
    """``tree:<name>`` -> file: the file's stem, or its folder's name for a ``tree.json`` (a run's)."""
    out: dict[str, Path] = {}
    for spec in paths:
        path = resolve_path(spec)
        name = path.parent.name if path.stem == "tree" else path.stem
        out.setdefault(f"tree:{name}", path)
    return out


def load_trees(paths: list[str]) -> dict:
    from autoprofiler.profiling import GROUPS
    from autoprofiler.tree import load_tree

    return {name: load_tree(path, catalog=GROUPS) for name, path in tree_names(paths).items()}


def check(cfg: dict) -> list[str]:
    """Problems with values, paths and trees, found before any work starts."""

    problems = []
    if cfg["environment"] not in ENVIRONMENTS:
        problems.append(f"environment: expected one of {ENVIRONMENTS}, got {cfg['environment']!r}")
    if cfg["split"] not in SPLITS:
        problems.append(f"split: expected one of {SPLITS}, got {cfg['split']!r}")
    fraction = cfg["test_fraction"]
    if isinstance(fraction, int | float) and not 0 < fraction < 1:
        problems.append(f"test_fraction: expected a number in (0, 1), got {fraction!r}")
    if cfg["rewriter"] not in CONFIG_REWRITERS:
        problems.append(f"rewriter: expected one of {', '.join(CONFIG_REWRITERS)}, got {cfg['rewriter']!r}")
    problems += task_problems(cfg["tasks"], cfg["filter"], cfg["max_tasks"])
    problems += tables_problems(cfg["tables"], cfg["environment"])
    if cfg["environment"] == "live":
        problems += worker_problems(cfg)
    if isinstance(cfg["probe"], list):
        problems += probe_problems(cfg["probe"], cfg["source"])
        if cfg["best_static"] is not None and cfg["best_static"] not in cfg["probe"]:
            problems.append(
                f"best_static: expected null or one of probe {cfg['probe']}, got {cfg['best_static']!r}"
            )
    if isinstance(cfg["trees"], list):
        problems += _tree_problems(cfg)
    seeds = cfg["seeds"]
    if isinstance(seeds, list) and (not seeds or not all(type(s) is int for s in seeds)):
        problems.append(f"seeds: expected a non-empty list of integers, got {seeds!r}")
    return problems


def _tree_problems(cfg: dict) -> list[str]:
    from autoprofiler.profiling import GROUPS
    from autoprofiler.tree import load_tree

    problems = []
    names = tree_names(cfg["trees"])
    if len(names) < len(cfg["trees"]):
        problems.append(f"trees: two trees would share a name ({sorted(names)}); rename one file")
    if cfg["random"] is True and not names:
        problems.append("random: the random policy takes the first tree's budget; give trees or random=false")
    for name, path in names.items():
        try:
            tree = load_tree(path, catalog=GROUPS)
        except Exception as exc:  # TreeError, OSError, JSON errors: name the file and the reason
            problems.append(f"trees: {str(path)!r} does not load: {' '.join(str(exc).split())[:400]}")
            continue
        if tree.source != cfg["source"]:
            problems.append(f"trees: {name} routes on {tree.source} profiles, but source={cfg['source']!r}")
    return problems


def read_config(argv: list[str], claim: bool = False) -> dict:
    """evaluate.yaml, then ``--config FILE``, then ``key=value`` overrides; raises ``ConfigError``.

    ``claim``: also refuse an ``out_dir`` that holds another run (unless ``overwrite``/``--resume``).
    """
    return load_config(CONFIG_PATH, argv, NESTED, check, __doc__, paths=PATHS, claim=claim)


# --- setup --------------------------------------------------------------------------------------------
def make_environment(cfg: dict, out: Path):
    """(environment, rewriter): a replay of ``tables``, or live workers keeping rows in ``tables``."""
    from autoprofiler.environments import LiveEnvironment, ReplayEnvironment

    rewriter = config_rewriter(cfg, out / "llm_cache")
    if cfg["environment"] == "replay":
        recordings = [resolve_path(t) for t in path_list(cfg["tables"])]
        runner = make_runner(cfg["runtime"], recording=recordings, source=cfg["source"])
        return ReplayEnvironment(recordings, rewriter, cfg["source"], runner=runner), rewriter
    runner = make_runner(cfg["runtime"], worker_spec(cfg), rewriter=rewriter)
    table_dir = resolve_path(cfg["tables"]) if cfg["tables"] else out / "tables"
    return LiveEnvironment(
        rewriter=rewriter, table_dir=table_dir, runner=runner, source=cfg["source"]
    ), rewriter


def compare(
    summary: dict, rows: list[dict], trees: list[str], probe: list[str], best_static: str | None, split: str
) -> str:
    """One sentence per tree: its geomean against the best static configuration's and the oracle's, and
    the paired ratio to the static one (``analysis.paired_ratio``); "beats" only when its interval is
    above 1."""
    from autoprofiler.analysis import beats, paired_ratio, ratio_text

    statics = {n: summary[f"static:{n}"]["geomean_speedup"] for n in probe}
    if not statics:
        return ""
    best = best_static or max(statics, key=statics.get)
    how = (
        "named in the config"
        if best_static
        else f"the best on the judged tasks (split {split}), in hindsight"
    )
    oracle = summary["oracle"]["geomean_speedup"]
    lines = []
    for name in trees:
        mine = summary[name]["geomean_speedup"]
        ratio = paired_ratio(rows, name, f"static:{best}")
        lines.append(
            f"{name}: {mine:.3f}x vs best static configuration {best} ({how}) {statics[best]:.3f}x vs "
            f"oracle {oracle:.3f}x; ratio {ratio_text(ratio)}; it "
            f"{'beats' if beats(ratio) else 'does NOT beat'} the static one."
        )
    return " ".join(lines)


# --- the story ----------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    from autoprofiler.analysis import evaluate_policies, split_tasks
    from autoprofiler.policies import Blind, Random, Static, TreePolicy
    from autoprofiler.profiling import CONFIGURATIONS, GROUPS
    from autoprofiler.report import build_report

    configure_logging()
    started = time.time()
    cfg = read_config(argv, claim=True)
    if cfg["environment"] == "live":
        problem = environment_problem(cfg["device"], cfg["source"], cfg["runtime"])
        if problem:
            raise EnvironmentProblem(problem)
    out = prepare_out_dir(cfg)
    print(config_line(save_config(out, cfg), cfg, SHOWN), flush=True)
    all_tasks, report, _ = select_tasks(cfg["tasks"], cfg["filter"], cfg["max_tasks"])
    trees = load_trees(cfg["trees"])
    env, rewriter = make_environment(cfg, out)
    sources = None
    try:
        # 1. the judged tasks: on a replay, those the recordings answer in full (so every policy answers)
        tasks = all_tasks
        if cfg["environment"] == "replay":
            tasks, sources = replay_tasks(env, all_tasks, report, out, cfg["seeds"])
        train, test = split_tasks(tasks, cfg["test_fraction"])
        judged = {"test": test, "train": train, "all": tasks}[cfg["split"]]
        print(
            f"environment: {cfg['environment']}; tasks: {len(all_tasks)} selected, {len(tasks)} usable, "
            f"{len(judged)} judged (split={cfg['split']}); {len(report.errors)} failed to load",
            flush=True,
        )
        if not judged:
            raise ConfigError([f"split: {cfg['split']} leaves no task to judge (of {len(tasks)} usable)"])
        groups = sorted(g for g, spec in GROUPS.items() if spec.source == cfg["source"])
        if cfg["environment"] == "replay":
            groups = sorted(set(groups) & {g for t in judged for g in env.profiler.recorded_groups(t)})
        else:  # every group of every judged task in one batched profiler run, before the policies route
            with stage("profiling"):
                failures = env.prefetch(judged, groups)
            for failure in failures:
                print(f"profiling failed: {failure}", flush=True)

        # 2. every policy on every judged task, all cells at once
        probes = {name: tuple(CONFIGURATIONS[name]) for name in cfg["probe"]}
        first = next(iter(trees.values()), None)
        policies = {
            "blind": Blind(),
            **{f"static:{n}": Static(n) for n in probes},
            **({"random": Random.like(first, seed=0, pool=groups)} if cfg["random"] and first else {}),
            **{name: TreePolicy(tree, name) for name, tree in trees.items()},
            "oracle": probes,
        }
        print(f"judging {len(policies)} policies on {len(judged)} tasks ...", flush=True)
        with stage("policies"):
            rows, summary = evaluate_policies(judged, policies, env, rewriter, cfg["seeds"])
        for name, s in summary.items():
            print(
                f"{name:>28}: geomean {s.get('geomean_speedup', float('nan')):.3f}x, accuracy "
                f"{s.get('accuracy', float('nan')):.2f}, passes/task {s.get('passes_per_task', 0):.1f}, "
                f"missing {s.get('missing', 0)}",
                flush=True,
            )
        verdict = compare(summary, rows, list(trees), list(probes), cfg["best_static"], cfg["split"])
        if verdict:
            print(verdict, flush=True)
        evaluation = {
            "split": cfg["split"],
            "tasks": len(judged),
            "environment": cfg["environment"],
            **({"sources": sources} if sources is not None else {}),
            "trees": {name: str(path) for name, path in tree_names(cfg["trees"]).items()},
            "verdict": verdict,
            "summary": summary,
            "rows": rows,
        }
        (out / "evaluation.json").write_text(json.dumps(evaluation, indent=1, default=str) + "\n")
    finally:
        env.close()

    # 3. the report: the tables' sections and this evaluation's
    tables = env.recordings if cfg["environment"] == "replay" else env.table_dir
    first_path = next(iter(tree_names(cfg["trees"]).values()), None)
    path = build_report(
        tables,
        out / "report",
        run_dir=out,
        tree_path=first_path,
        title=f"evaluation {out.name}",
        tasks=[t.hash for t in judged],
    )
    print(
        f"evaluation: {out / 'evaluation.json'}\nreport: {path}\ndone in {time.time() - started:.0f}s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
