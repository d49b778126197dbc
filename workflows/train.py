"""Train a profiling tree, judge it on held-out tasks against the best static configuration and the
oracle, and write the tree, the learning log and a report.

Run (embedded default: CPU, torch.profiler, rule rewriter, no GPU, no LLM; a few minutes on 2 CPUs):

    python workflows/train.py
    python workflows/train.py --config workflows/train.yaml key=value ...   # overrides, dotted for nesting
    python workflows/train.py environment=replay tables=datasets/h200_suite source=ncu tree=trees/seed.json \
        probe='[algorithm, memory, latency, compute]' out_dir=runs/h200-replay

Outputs in ``out_dir``: ``config.json`` (the resolved config), ``tree.json`` (the learned tree),
``proposals.jsonl`` (every proposal: statistics, accepted or why not), ``state.json`` (checkpoint),
``evaluation.json`` (held-out policy comparison), ``oracle.json``, ``refinement.json`` (when asked),
``report/report.md`` (+ PNGs). Live runs also write their recording to ``tables`` (``out_dir/tables``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a bare checkout (ray job submit --working-dir .) runs it too
    sys.path.insert(0, str(REPO))

from autoprofiler.workflow import (  # noqa: E402
    ConfigError,
    EnvironmentProblem,
    load_config,
    make_runner,
    save_config,
)

CONFIG_PATH = Path(__file__).with_name("train.yaml")
ENVIRONMENTS = ("live", "replay", "auto")
NESTED = ("rewriter_options", "llm", "eval", "learn", "lone_budget", "runtime")  # dotted overrides


def _path(spec: str) -> Path:
    return Path(spec) if Path(spec).is_absolute() else REPO / spec


def check(cfg: dict) -> list[str]:
    """Problems with values, paths and the starting tree, found before any work starts."""
    problems = []
    if cfg["environment"] not in ENVIRONMENTS:
        problems.append(f"environment: expected one of {ENVIRONMENTS}, got {cfg['environment']!r}")
    if cfg["proposer"] not in ("statistical", "llm"):
        problems.append(f"proposer: expected statistical or llm, got {cfg['proposer']!r}")
    fraction = cfg["test_fraction"]
    if isinstance(fraction, int | float) and not 0 < fraction < 1:
        problems.append(f"test_fraction: expected a number in (0, 1), got {fraction!r}")
    if isinstance(cfg["tasks"], str) and not _path(cfg["tasks"]).exists():
        problems.append(f"tasks: {cfg['tasks']!r} does not exist")
    if cfg["environment"] == "replay" and not cfg["tables"]:
        problems.append("tables: environment=replay needs tables=<a recording folder>")
    if cfg["tables"] and cfg["environment"] == "replay" and not (_path(cfg["tables"]) / "rewards").is_dir():
        problems.append(f"tables: {cfg['tables']!r} is not a recording (no rewards/ folder)")
    if isinstance(cfg["tree"], str) and isinstance(cfg["source"], str):
        try:
            initial_tree(cfg)
        except Exception as exc:  # TreeError, OSError: name the key and the reason, no traceback
            problems.append(f"tree: {cfg['tree']!r} does not load: {' '.join(str(exc).split())[:400]}")
    if isinstance(cfg["learn"], dict):
        from autoprofiler.learning import LearnConfig

        try:
            LearnConfig(**cfg["learn"])
        except (TypeError, ValueError) as exc:
            problems.append(f"learn: {' '.join(str(exc).split())}")
    return problems


def read_config(argv: list[str]) -> dict:
    """train.yaml, then ``--config FILE``, then ``key=value`` overrides; raises ``ConfigError``."""
    return load_config(CONFIG_PATH, argv, NESTED, check, __doc__)


# --- setup --------------------------------------------------------------------------------------------
def select_tasks(cfg: dict):
    from autoprofiler.tasks import load_tasks

    report = load_tasks(_path(cfg["tasks"]))
    tasks = list(report.tasks)
    if cfg["task_filter"]:
        wanted = list(cfg["task_filter"])
        tasks = [t for t in tasks if t.id.split("/")[-1] in wanted or t.id in wanted]
    if cfg["max_tasks"]:
        tasks = tasks[: cfg["max_tasks"]]
    return tasks, report


def make_environment(cfg: dict, out: Path):
    """(environment, rewriter, kind): a replay of a recording, or live workers (Ray actors by default)."""
    from autoprofiler.environments import LiveEnvironment, ReplayEnvironment
    from autoprofiler.rewriters import make_rewriter
    from autoprofiler.runtime import WorkerSpec

    options = dict(cfg["rewriter_options"] or {})
    llm = cfg["llm"] or {}
    if cfg["rewriter"] == "openai":
        from autoprofiler.llm import ChatClient

        cache = str(out / "llm_cache") if llm.get("cache") else False
        options.setdefault(
            "client", ChatClient(base_url=llm.get("base_url"), model=llm.get("model"), cache=cache)
        )
    rewriter = make_rewriter(cfg["rewriter"], **options)
    tables = _path(cfg["tables"]) if cfg["tables"] else None
    kind = cfg["environment"]
    if kind == "auto":
        recorded = tables and (tables / "rewards").is_dir() and (tables / "profiles").is_dir()
        kind = "replay" if recorded else "live"
    if kind == "replay":
        runner = make_runner(cfg["runtime"], recording=tables, source=cfg["source"])
        return ReplayEnvironment(tables, rewriter, cfg["source"], runner=runner), rewriter, kind
    spec = WorkerSpec(
        device=cfg["device"],
        task_size=cfg["task_size"],
        source=cfg["source"],
        eval=dict(cfg["eval"] or {}),
        rewriter=cfg["rewriter"],
        rewriter_options=dict(cfg["rewriter_options"] or {}),
        llm={k: v for k, v in llm.items() if k in ("base_url", "model")},
        concurrency=cfg["runtime"].get("concurrency", 1),
    )
    runner = make_runner(cfg["runtime"], spec, rewriter=rewriter)
    env = LiveEnvironment(
        rewriter=rewriter, table_dir=tables or out / "tables", runner=runner, source=cfg["source"]
    )
    return env, rewriter, kind


def make_proposer(cfg: dict, out: Path):
    from autoprofiler.learning import LLMProposer, StatisticalProposer

    if cfg["proposer"] == "statistical":
        return StatisticalProposer()
    from autoprofiler.llm import ChatClient

    llm = cfg["llm"] or {}
    return LLMProposer(
        ChatClient(
            base_url=llm.get("base_url"),
            model=llm.get("model"),
            cache=str(out / "llm_cache") if llm.get("cache") else False,
        )
    )


def initial_tree(cfg: dict):
    """The tree to start from: a JSON file, or ``lone:g1,g2`` (one leaf showing those groups).

    A lone leaf's vocabulary is every catalog group of the source; its budget is ``lone_budget``.
    """
    from autoprofiler.profiling import GROUPS
    from autoprofiler.tree import load_tree, vocabulary_from_catalog

    spec = cfg["tree"]
    if spec.startswith("lone:"):
        names = sorted(g for g, m in GROUPS.items() if m.source == cfg["source"])
        groups = [g for g in spec[len("lone:") :].split(",") if g]
        data = {
            "schema_version": 1,
            "source": cfg["source"],
            "vocabulary": vocabulary_from_catalog(names, GROUPS),
            "budget": dict(cfg["lone_budget"]),
            "provenance": {"name": "lone-leaf", "spec": spec},
            "nodes": [{"id": "all", "type": "leaf", "groups": groups}],
        }
        return load_tree(data, catalog=GROUPS)
    return load_tree(_path(spec), catalog=GROUPS)


# --- the story ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from autoprofiler.analysis import evaluate_policies, oracle_analysis, outcome_matrix, refine, split_tasks
    from autoprofiler.learning import LearnConfig, Learner
    from autoprofiler.policies import Blind, Random, Static, TreePolicy
    from autoprofiler.profiling import CONFIGURATIONS, GROUPS
    from autoprofiler.report import build_report
    from autoprofiler.rewards import configuration_name
    from autoprofiler.tree import save_tree

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("autoprofiler.profiling", "autoprofiler.evaluation"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.time()
    try:
        cfg = read_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(cfg["out_dir"])
    print(f"config: {save_config(out, cfg)}", flush=True)

    # 1. tasks, split fixed by task-id hash
    tasks, report = select_tasks(cfg)
    try:
        env, rewriter, kind = make_environment(cfg, out)
    except EnvironmentProblem as exc:  # e.g. device=cuda where there is none: one line, the fix
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if kind == "replay":  # judge every policy on the same tasks: those recorded with every group
        tasks, lacking = env.fully_recorded(tasks)
        for task_id, missing in lacking.items():
            print(f"not used: {task_id} (recorded groups lack {missing})", flush=True)
    train, test = split_tasks(tasks, cfg["test_fraction"])
    if not test and len(train) > 1:
        test = [train.pop()]
    print(
        f"environment: {kind}; tasks: {len(tasks)} ({len(train)} train, {len(test)} test; "
        f"{len(report.errors)} failed to load)",
        flush=True,
    )
    if not train:
        raise SystemExit(f"no training tasks (tasks={cfg['tasks']!r}, filter={cfg['task_filter']!r})")
    groups = sorted({g for g, spec in GROUPS.items() if spec.source == cfg["source"]})
    if kind == "replay":
        groups = sorted(set(groups) & {g for t in train for g in env.profiler.recorded_groups(t)})
    else:  # profile every task with every group up front: one batched profiler run
        for failure in env.prefetch(tasks, groups):
            print(f"profiling failed: {failure}", flush=True)

    # 2. learn
    tree0 = initial_tree(cfg)
    probes = {name: tuple(CONFIGURATIONS[name]) for name in cfg["probe"]}
    learner = Learner(
        env,
        train,
        make_proposer(cfg, out),
        LearnConfig(**(cfg["learn"] or {})),
        out_dir=out,
        rewriter=rewriter,
        catalog=GROUPS,
        probe_configurations=probes,
        groups=groups,
    )
    try:
        tree = learner.fit(tree0, resume=cfg["resume"])
        save_tree(tree, out / "tree.json")
        s = learner.summary()
        print(
            f"learned: {len(learner.decisions_)} decisions, accepted {s['accepted']}; "
            f"evaluations {s['evaluations']}",
            flush=True,
        )

        # 3. judge on held-out tasks: blind, static configurations, random, seed tree, learned tree, oracle
        policies = {
            "blind": Blind(),
            **{f"static:{n}": Static(n) for n in probes},
            "random": Random.like(tree, seed=0, pool=groups),
            "seed_tree": TreePolicy(tree0, "seed_tree"),
            "learned_tree": TreePolicy(tree, "learned_tree"),
            "oracle": probes,
        }
        rows, summary = evaluate_policies(test, policies, env, rewriter)
        train_static = {
            n: sum(learner.reward(t, configuration_name(g)) for t in learner.tasks) for n, g in probes.items()
        }
        best_static = max(train_static, key=train_static.get)
        lt, bs, orc = (
            summary[k]["geomean_speedup"] for k in ("learned_tree", f"static:{best_static}", "oracle")
        )
        verdict = (
            f"Held-out geomean speedup: learned tree {lt:.3f}x, best static configuration (chosen on train: "
            f"{best_static}) {bs:.3f}x, oracle {orc:.3f}x. The learned tree "
            f"{'beats' if lt > bs else 'does NOT beat'} the best static configuration."
        )
        print(verdict, flush=True)
        (out / "evaluation.json").write_text(
            json.dumps(
                {
                    "split": "test",
                    "tasks": len(test),
                    "train_tasks": len(train),
                    "environment": kind,
                    "best_static_on_train": best_static,
                    "verdict": verdict,
                    "summary": summary,
                    "rows": rows,
                    "learner": s,
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
        matrix = outcome_matrix(test + train, probes, env, rewriter)
        (out / "oracle.json").write_text(json.dumps(oracle_analysis(matrix), indent=1, default=str) + "\n")
        if cfg["refinement_rounds"]:
            ref = refine(test, TreePolicy(tree, "learned_tree"), env, cfg["refinement_rounds"], rewriter)
            (out / "refinement.json").write_text(json.dumps({"rows": ref}, indent=1, default=str) + "\n")
    finally:
        env.close()

    # 4. report from the tables (+ this run's outputs)
    tables = env.recording if kind == "replay" else env.table_dir
    path = build_report(tables, out / "report", run_dir=out, title=f"training run {out.name}")
    print(f"report: {path}\ndone in {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
