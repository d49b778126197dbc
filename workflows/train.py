"""Train a profiling tree, judge it on held-out tasks against the best static configuration and the
oracle, and write the tree, the learning log and a report.

Run (embedded default: replay of the two committed H200 recordings, the suite's and the generated
tasks', on local Ray, rule rewriter, no GPU, no LLM; about 30 s on 2 CPUs):

    python workflows/train.py
    python workflows/train.py --config workflows/train.yaml key=value ...   # overrides, dotted for nesting
    python workflows/train.py --config workflows/train_cpu_live.yaml        # live on CPU: a few minutes
    python workflows/train.py tables=datasets/h200_suite tasks=datasets/suite  # one recording, one source

``tables`` and ``tasks`` take a path or a list of paths: a replay reads the union of the recordings, the
tasks of every source are merged by id (an id with two contents, or one content under two ids, is a
config error). A replay learns and judges on the tasks the recordings answer in full: every profile
group and, for a rule rewriter, every action's reward row (``ReplayEnvironment.coverage``); it prints one
line per recording saying how many were used and why the others were left out (``tasks_left_out.json``
lists them), and ``evaluation.json`` records the recordings and task sources with their counts.

Outputs in ``out_dir``: ``config.json`` (the resolved config), ``tree.json`` (the learned tree),
``proposals.jsonl`` (every proposal: statistics, accepted or why not), ``state.json`` (checkpoint),
``evaluation.json`` (held-out policy comparison; the verdict comes from its paired bootstrap interval
of the learned tree over the best static configuration, ``learned_over_best_static``; what the
accepted edits bought, ``learned_over_seed``) and ``policy_rows.parquet`` (its rows),
``oracle.json``, ``refinement.json`` (when asked), ``tasks_left_out.json`` (a replay's: why each),
``report/report.md`` (+ PNGs, about this run's tasks only). Live runs also write their recording to
``tables`` (``out_dir/tables``). An ``out_dir`` that already holds a run is refused: ``--resume``
continues it from its checkpoint, ``--overwrite`` deletes it first.

Exit codes: 0 done; 2 a config problem (every one on its own line, before any work); 3 this machine
cannot run it (no CUDA, no ncu, Ray does not start), with the fix.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a bare checkout (ray job submit --working-dir .) runs it too
    sys.path.insert(0, str(REPO))

from autoprofiler.rewriters import ExperienceRewriter, RuleRewriter  # noqa: E402
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
    worker_problems,
    worker_spec,
)
from autoprofiler.workflow_sources import (  # noqa: E402
    checked_tasks,
    is_recording,
    path_list,
    replay_tasks,
    tables_problems,
)

CONFIG_PATH = Path(__file__).with_name("train.yaml")
ENVIRONMENTS = ("live", "replay", "auto")
NESTED = ("rewriter_options", "llm", "eval", "learn", "lone_budget", "runtime")  # dotted overrides
PATHS = ("tables", "tasks")  # a path or a list of paths
SHOWN = ("environment", "tasks", "task_filter", "max_tasks", "source", "device", "tree", "rewriter")


#: The config's rewriters, and experience-v1, fitted here on the training tasks (``fit_experience``).
TRAIN_REWRITERS = (*CONFIG_REWRITERS, "experience")


def check(cfg: dict) -> list[str]:
    """Problems with values, paths, the tasks and the starting tree, found before any work starts."""

    problems = []
    if cfg["environment"] not in ENVIRONMENTS:
        problems.append(f"environment: expected one of {ENVIRONMENTS}, got {cfg['environment']!r}")
    if cfg["proposer"] not in ("statistical", "llm"):
        problems.append(f"proposer: expected statistical or llm, got {cfg['proposer']!r}")
    if cfg["rewriter"] not in TRAIN_REWRITERS:
        problems.append(f"rewriter: expected one of {', '.join(TRAIN_REWRITERS)}, got {cfg['rewriter']!r}")
    if cfg["rewriter"] == "experience" and environment_kind(cfg) != "replay":
        problems.append("rewriter: experience is fitted on a recording's training tasks; it needs a replay")
    unknown = set(cfg["rewriter_options"] or {}) - {"k", "leave_one_out"}
    if cfg["rewriter"] == "experience" and unknown:
        problems.append(f"rewriter_options: experience takes k and leave_one_out, got {sorted(unknown)}")
    fraction = cfg["test_fraction"]
    if isinstance(fraction, int | float) and not 0 < fraction < 1:
        problems.append(f"test_fraction: expected a number in (0, 1), got {fraction!r}")
    chosen, task_lines = checked_tasks(
        cfg["tasks"], cfg["task_filter"], cfg["max_tasks"], filter_key="task_filter"
    )
    problems += task_lines
    if not problems and chosen is not None and len(chosen) < 2:
        problems.append(
            f"tasks: {len(chosen)} selected; training needs at least 2 (one to learn on, one held out)"
        )
    problems += tables_problems(cfg["tables"], cfg["environment"])
    if cfg["environment"] == "live":
        problems += worker_problems(cfg)
    if isinstance(cfg["probe"], list) and isinstance(cfg["source"], str):
        problems += probe_problems(cfg["probe"], cfg["source"])
    if isinstance(cfg["tree"], str) and isinstance(cfg["source"], str):
        problems += _tree_problems(cfg)
    if isinstance(cfg["learn"], dict):
        from autoprofiler.learning import LearnConfig

        try:
            LearnConfig(**cfg["learn"])
        except (TypeError, ValueError) as exc:
            problems.append(f"learn: {' '.join(str(exc).split())}")
    return problems


def _tree_problems(cfg: dict) -> list[str]:
    try:
        tree = initial_tree(cfg)
    except Exception as exc:  # TreeError, OSError, JSON errors: name the key and the reason, no traceback
        return [f"tree: {cfg['tree']!r} does not load: {' '.join(str(exc).split())[:400]}"]
    if tree.source != cfg["source"]:
        other = "trees/seed.json" if cfg["source"] == "ncu" else "trees/seed_torch.json"
        return [
            f"tree: {cfg['tree']!r} routes on {tree.source} profiles, but source={cfg['source']!r}; "
            f"pass source={tree.source} or a {cfg['source']} tree ({other}, lone:...)"
        ]
    return []


def read_config(argv: list[str], claim: bool = False) -> dict:
    """train.yaml, then ``--config FILE``, then ``key=value`` overrides; raises ``ConfigError``.

    ``claim``: also refuse an ``out_dir`` that holds another run (unless ``--resume`` or ``--overwrite``).
    """
    return load_config(CONFIG_PATH, argv, NESTED, check, __doc__, paths=PATHS, claim=claim)


# --- setup --------------------------------------------------------------------------------------------
def environment_kind(cfg: dict) -> str:
    """``live`` or ``replay`` (``auto``: replay when every ``tables`` folder holds a recording)."""
    if cfg["environment"] != "auto":
        return cfg["environment"]
    return "replay" if is_recording(cfg["tables"]) else "live"


def make_environment(cfg: dict, kind: str, out: Path):
    """(environment, rewriter): a replay of a recording, or live workers (Ray actors by default)."""
    from autoprofiler.environments import LiveEnvironment, ReplayEnvironment

    # experience: the rule rewriter until the split is known (its coverage asks for every rule
    # action's row, as the fit does), then ``fit_experience``
    rewriter = RuleRewriter() if cfg["rewriter"] == "experience" else config_rewriter(cfg, out / "llm_cache")
    if kind == "replay":
        recordings = [resolve_path(t) for t in path_list(cfg["tables"])]
        runner = make_runner(cfg["runtime"], recording=recordings, source=cfg["source"])
        return ReplayEnvironment(recordings, rewriter, cfg["source"], runner=runner), rewriter
    tables = resolve_path(cfg["tables"]) if cfg["tables"] else None  # one folder (checked)
    runner = make_runner(cfg["runtime"], worker_spec(cfg), rewriter=rewriter)
    env = LiveEnvironment(
        rewriter=rewriter, table_dir=tables or out / "tables", runner=runner, source=cfg["source"]
    )
    return env, rewriter


def fit_experience(cfg: dict, env, train: list) -> ExperienceRewriter:
    """experience-v1 fitted on the training tasks of the replayed recordings only (held-out rows unseen)."""
    hashes = {t.hash for t in train}
    recordings = [resolve_path(t) for t in path_list(cfg["tables"])]
    options = cfg["rewriter_options"] or {}
    rewriter = ExperienceRewriter.from_recording(
        recordings,
        k=int(options.get("k", 3)),
        source=cfg["source"],
        train=hashes.__contains__,
        leave_one_out=bool(options.get("leave_one_out", True)),  # the learner scores on training tasks
        # an action recorded on some tasks only (a playbook action where the playbook reaches it) could
        # be chosen for a task the replay has no outcome of: choose among those every training task has
        common_actions_only=True,
    )
    env.use_rewriter(rewriter)
    print(
        f"rewriter: {rewriter.identity}, fitted on {len(rewriter.experience)} training tasks, choosing among "
        f"{', '.join(rewriter.actions())}",
        flush=True,
    )
    return rewriter


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
    return load_tree(resolve_path(spec), catalog=GROUPS)


# --- the story ----------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    from autoprofiler.analysis import (
        beats,
        evaluate_policies,
        oracle_analysis,
        outcome_frame,
        outcome_matrix,
        paired_ratio,
        ratio_text,
        refine,
        split_tasks,
    )
    from autoprofiler.learning import LearnConfig, Learner
    from autoprofiler.policies import TreePolicy, held_out_policies
    from autoprofiler.profiling import CONFIGURATIONS, GROUPS
    from autoprofiler.report import build_report
    from autoprofiler.rewards import configuration_name
    from autoprofiler.tree import save_tree

    configure_logging()
    started = time.time()
    # 0. everything that can be checked before any work: config, paths, tasks, tree, out_dir, machine
    cfg = read_config(argv, claim=True)
    kind = environment_kind(cfg)
    if kind == "live":
        problem = environment_problem(cfg["device"], cfg["source"], cfg["runtime"])
        if problem:
            raise EnvironmentProblem(problem)
    out = prepare_out_dir(cfg)
    print(config_line(save_config(out, cfg), {**cfg, "environment": kind}, SHOWN), flush=True)

    # 1. tasks, split fixed by task-id hash
    tasks, report, _ = select_tasks(cfg["tasks"], cfg["task_filter"], cfg["max_tasks"])
    env, rewriter = make_environment(cfg, kind, out)
    sources = None
    try:
        if kind == "replay":  # learn and judge on the tasks the recordings answer in full
            tasks, sources = replay_tasks(env, tasks, report, out)
        train, test = split_tasks(tasks, cfg["test_fraction"])
        if not test and len(train) > 1:
            test = [train.pop()]
        print(
            f"tasks: {len(tasks)} ({len(train)} train, {len(test)} held out; {len(report.errors)} failed to "
            "load)",
            flush=True,
        )
        if not train or not test:
            raise ConfigError(
                [f"tasks: {len(tasks)} usable; training needs one to learn on and one held out"]
            )
        if cfg["rewriter"] == "experience":
            rewriter = fit_experience(cfg, env, train)
        groups = sorted({g for g, spec in GROUPS.items() if spec.source == cfg["source"]})
        if kind == "replay":
            groups = sorted(set(groups) & {g for t in train for g in env.profiler.recorded_groups(t)})
        else:  # profile every task with every group up front: one batched profiler run
            print(f"profiling {len(tasks)} tasks with {len(groups)} groups ...", flush=True)
            with stage("profiling"):
                failures = env.prefetch(tasks, groups)
            for failure in failures:
                print(f"profiling failed: {failure['task_id']}: {failure['error'][:300]}", flush=True)
            if len({f["task_id"] for f in failures} & {t.id for t in train}) == len(train):
                raise EnvironmentProblem(
                    f"profiling failed for every training task (first: {failures[0]['error'][:300]}); "
                    "check that `autoprofiler profile` works on one of them here"
                )

        # 2. learn: the probe sweep, then one decision per proposal (one log line each)
        tree0 = initial_tree(cfg)
        probes = {name: tuple(CONFIGURATIONS[name]) for name in cfg["probe"]}
        learn = LearnConfig(**(cfg["learn"] or {}))
        print(
            f"learning on {len(train)} tasks: probe sweep of {len(probes)} configurations, then up to "
            f"{learn.max_decisions} decisions",
            flush=True,
        )
        learner = Learner(
            env,
            train,
            make_proposer(cfg, out),
            learn,
            out_dir=out,
            rewriter=rewriter,
            catalog=GROUPS,
            probe_configurations=probes,
            groups=groups,
        )
        with stage("learning"):
            tree = learner.fit(tree0, resume=cfg["resume"])
        save_tree(tree, out / "tree.json")
        s = learner.summary()
        ev = s["evaluations"]
        print(
            f"learned: {len(learner.decisions_)} decisions, {len(s['accepted'])} accepted"
            + (f" ({'; '.join(s['accepted'])})" if s["accepted"] else "")
            + f"; cells evaluated {ev.get('new_cells', 0)} (probe sweep {ev.get('sweep', 0)})",
            flush=True,
        )

        # 3. judge on held-out tasks: blind, static configurations, random, seed tree, learned tree, oracle
        policies = held_out_policies(tree0, tree, probes, groups)
        print(f"judging {len(policies)} policies on {len(test)} held-out tasks ...", flush=True)
        with stage("held-out policies"):
            rows, summary = evaluate_policies(test, policies, env, rewriter)
        train_static = {
            n: sum(learner.reward(t, configuration_name(g)) for t in learner.tasks) for n, g in probes.items()
        }
        best_static = max(train_static, key=train_static.get)
        lt, bs, orc = (
            summary[k]["geomean_speedup"] for k in ("learned_tree", f"static:{best_static}", "oracle")
        )
        ratio = paired_ratio(rows, "learned_tree", f"static:{best_static}")
        gain = paired_ratio(rows, "learned_tree", "seed_tree")  # what the accepted edits bought held out
        verdict = (
            f"Held-out geomean speedup: learned tree {lt:.3f}x, best static configuration (chosen on train: "
            f"{best_static}) {bs:.3f}x, oracle {orc:.3f}x; learned / best static {ratio_text(ratio)}. "
            f"The learned tree {'beats' if beats(ratio) else 'does NOT beat'} the best static configuration."
            + (
                f" Learned / seed tree (what the accepted edits bought): {ratio_text(gain)}."
                if s["accepted"]
                else " No edit was accepted: the learned tree is the seed tree."
            )
        )
        print(verdict, flush=True)
        (out / "evaluation.json").write_text(
            json.dumps(
                {
                    "split": "test",
                    "tasks": len(test),
                    "train_tasks": len(train),
                    "environment": kind,
                    **({"sources": sources} if sources is not None else {}),
                    "best_static_on_train": best_static,
                    "learned_over_best_static": ratio.as_dict(),
                    "learned_over_seed": gain.as_dict(),
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
        keys = ("policy", "task_id", "task_hash", "level", "seed", "device", "configuration", "leaf")
        keys += ("action",)
        outcome_frame(rows, keys).write_parquet(out / "policy_rows.parquet")  # the held-out rows, for polars
        with stage("oracle matrix"):
            matrix = outcome_matrix(test + train, probes, env, rewriter)
        (out / "oracle.json").write_text(json.dumps(oracle_analysis(matrix), indent=1, default=str) + "\n")
        if cfg["refinement_rounds"]:
            print(
                f"refinement: {cfg['refinement_rounds']} rounds on {len(test)} held-out tasks ...", flush=True
            )
            with stage("refinement"):
                ref = refine(test, TreePolicy(tree, "learned_tree"), env, cfg["refinement_rounds"], rewriter)
            (out / "refinement.json").write_text(json.dumps({"rows": ref}, indent=1, default=str) + "\n")
    finally:
        env.close()

    # 4. report from the tables, restricted to this run's tasks (+ this run's outputs)
    tables = env.recordings if kind == "replay" else env.table_dir
    path = build_report(
        tables, out / "report", run_dir=out, title=f"training run {out.name}", tasks=[t.hash for t in tasks]
    )
    print(f"outputs: {out}/ (tree.json, proposals.jsonl, evaluation.json, oracle.json)", flush=True)
    print(f"report: {path}\ndone in {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
