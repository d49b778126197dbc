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

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG_PATH = Path(__file__).with_name("train.yaml")
ENVIRONMENTS = ("live", "replay", "auto")
NESTED = (
    "rewriter_options",
    "llm",
    "eval",
    "learn",
    "lone_budget",
)  # free-form dicts, checked by their consumers


# --- config -------------------------------------------------------------------------------------------
def _type_ok(default, value) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, type(default))


def load_config(argv: list[str]) -> dict:
    """File defaults (``train.yaml``), then ``--config FILE``, then ``key=value`` overrides; all checked.

    Every problem (unknown key, wrong type, bad value) is collected and reported at once.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="a YAML config (keys as in workflows/train.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue from out_dir's last checkpoint")
    parser.add_argument("overrides", nargs="*", help="key=value (YAML values; dots for nested keys)")
    args = parser.parse_args(argv)
    schema = yaml.safe_load(CONFIG_PATH.read_text())
    cfg = json.loads(json.dumps(schema))
    problems = []
    if args.config:
        given = yaml.safe_load(Path(args.config).read_text()) or {}
        for k, v in given.items():
            if k not in schema:
                problems.append(f"{args.config}: unknown key {k!r}")
            else:
                cfg[k] = v
    for item in args.overrides:
        if "=" not in item:
            problems.append(f"override {item!r}: expected key=value")
            continue
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else None
        head, _, rest = key.partition(".")
        if head not in schema:
            problems.append(f"override {key!r}: unknown key (known: {', '.join(schema)})")
        elif rest:
            if head not in NESTED:
                problems.append(f"override {key!r}: {head!r} is not a nested section")
            else:
                cfg[head] = {**(cfg[head] or {}), rest: value}
        else:
            cfg[head] = value
    for k, v in cfg.items():
        if not _type_ok(schema[k], v):
            problems.append(f"{k}: expected {type(schema[k]).__name__}, got {v!r} ({type(v).__name__})")
    if cfg["environment"] not in ENVIRONMENTS:
        problems.append(f"environment: expected one of {ENVIRONMENTS}, got {cfg['environment']!r}")
    if cfg["proposer"] not in ("statistical", "llm"):
        problems.append(f"proposer: expected statistical or llm, got {cfg['proposer']!r}")
    if not 0 < (cfg["test_fraction"] or 0) < 1:
        problems.append(f"test_fraction: expected a number in (0, 1), got {cfg['test_fraction']!r}")
    if problems:
        raise SystemExit("invalid config:\n  - " + "\n  - ".join(problems))
    cfg["resume"] = bool(cfg["resume"] or args.resume)
    return cfg


# --- setup --------------------------------------------------------------------------------------------
def select_tasks(cfg: dict):
    from autoprofiler.tasks import load_tasks

    report = load_tasks(REPO / cfg["tasks"] if not Path(cfg["tasks"]).is_absolute() else cfg["tasks"])
    tasks = list(report.tasks)
    if cfg["task_filter"]:
        wanted = list(cfg["task_filter"])
        tasks = [t for t in tasks if t.id.split("/")[-1] in wanted or t.id in wanted]
    if cfg["max_tasks"]:
        tasks = tasks[: cfg["max_tasks"]]
    return tasks, report


def make_environment(cfg: dict, out: Path):
    """(environment, rewriter, close function)."""
    from autoprofiler.environments import LiveEnvironment, ReplayEnvironment
    from autoprofiler.rewriters import make_rewriter

    options = dict(cfg["rewriter_options"] or {})
    if cfg["rewriter"] == "openai":
        from autoprofiler.llm import ChatClient

        llm = cfg["llm"] or {}
        options.setdefault(
            "client",
            ChatClient(
                base_url=llm.get("base_url"),
                model=llm.get("model"),
                cache=str(out / "llm_cache") if llm.get("cache") else False,
            ),
        )
    rewriter = make_rewriter(cfg["rewriter"], **options)
    tables = Path(cfg["tables"]) if cfg["tables"] else None
    kind = cfg["environment"]
    if kind == "auto":
        kind = (
            "replay"
            if tables and (tables / "rewards").is_dir() and (tables / "profiles").is_dir()
            else "live"
        )
    if kind == "replay":
        if tables is None:
            raise SystemExit("environment=replay needs tables=<a recording folder>")
        return (
            ReplayEnvironment.from_dir(tables, rewriter=rewriter, source=cfg["source"]),
            rewriter,
            lambda: None,
            kind,
        )
    from autoprofiler.evaluation import EvalConfig, Evaluator
    from autoprofiler.profiling import Profiler

    profiler = Profiler(source=cfg["source"], device=cfg["device"], task_size=cfg["task_size"])
    evaluator = Evaluator(EvalConfig(device=cfg["device"], task_size=cfg["task_size"], **(cfg["eval"] or {})))
    env = LiveEnvironment(profiler, rewriter, evaluator, tables or out / "tables")

    def close():
        env.close()
        evaluator.close()

    return env, rewriter, close, kind


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
    return load_tree(REPO / spec if not Path(spec).is_absolute() else spec, catalog=GROUPS)


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
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"config: {json.dumps(cfg)}", flush=True)

    # 1. tasks, split fixed by task-id hash
    tasks, report = select_tasks(cfg)
    env, rewriter, close, kind = make_environment(cfg, out)
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
        close()

    # 4. report from the tables (+ this run's outputs)
    tables = Path(cfg["tables"]) if kind == "replay" else env.table_dir
    path = build_report(tables, out / "report", run_dir=out, title=f"training run {out.name}")
    print(f"report: {path}\ndone in {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
