"""Every RuleRewriter action on a set of tasks: which actions pass the evaluator where, and how fast.

The replay environment needs every action's outcome per task, and the rules should pick actions that
pass where they apply: this sweep measures both. Each (task, action) is an action cell evaluated by the
runtime's workers (the same cells ``oracle_sweep.py`` records); ``tf32`` is evaluated once more at a
loose tolerance (``tf32_tolerance``), since TF32 is expected to fail the fp32 default of 1e-4.

Run (embedded default: two suite tasks on CPU at small shapes, GpuWorker actors on a local Ray):

    python workflows/rule_sweep.py
    python workflows/rule_sweep.py --config workflows/rule_sweep.yaml key=value ...   # dotted for nesting
    python3 workflows/rule_sweep.py device=cuda task_size=full filter=[] actions=[] eval.timing_trials=50 \
        runtime.ray=false runtime.concurrency=3 out_dir=runs/rule_sweep_h200     # on a GPU, no Ray needed

On a Ray cluster (docs/cluster.md):

    ray job submit --working-dir . -- python workflows/rule_sweep.py out_dir=/shared/rules device=cuda ...

Outputs in ``out_dir``: ``config.json`` (resolved config and provenance), ``tables/`` (the action rows,
reward schema, keyed by task, action and seed: ``--resume`` continues a stopped sweep and reuses them,
so change the evaluation settings with a new ``out_dir``; an ``out_dir`` holding a sweep is refused
without ``--resume`` or ``--overwrite``), ``tables_tf32_tol<t>/`` (the loose-tolerance tf32 rows),
``rule_actions.json`` (every evaluation and the per-action summary) and ``rule_actions.md`` (both as
tables).
"""

from __future__ import annotations

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
    prepare_out_dir,
    resolve_path,
    run_main,
    save_config,
    select_tasks,
    task_problems,
    worker_problems,
    worker_spec,
)

CONFIG_PATH = Path(__file__).with_name("rule_sweep.yaml")
NESTED = ("rewriter_options", "eval", "runtime")  # sections that take dotted overrides
#: The reward-row columns of one evaluation that the tables show.
OUTCOME_FIELDS = (
    "correct",
    "error_kind",
    "error",
    "ref_ms",
    "new_ms",
    "speedup",
    "effective_speedup",
    "reward",
    "eval_seconds",
)

SHOWN = ("tasks", "filter", "actions", "device", "task_size", "tf32_tolerance")


def check(cfg: dict) -> list[str]:
    """Problems with values and paths, found before any work starts."""
    from autoprofiler.rewriters import RuleRewriter

    problems = worker_problems(cfg)
    problems += task_problems(
        resolve_path(cfg["tasks"]) if isinstance(cfg["tasks"], str) else None, cfg["filter"], cfg["max_tasks"]
    )
    if isinstance(cfg["actions"], list):
        unknown = [a for a in cfg["actions"] if a not in RuleRewriter.actions()]
        if unknown:
            problems.append(f"actions: {unknown} are not rule actions (known: {RuleRewriter.actions()})")
    seeds = cfg["seeds"]
    if isinstance(seeds, list) and (not seeds or not all(type(s) is int for s in seeds)):
        problems.append(f"seeds: expected a non-empty list of integers, got {seeds!r}")
    tolerance = cfg["tf32_tolerance"]
    if isinstance(tolerance, int | float) and not tolerance > 0:
        problems.append(f"tf32_tolerance: expected a number > 0 or null, got {tolerance!r}")
    return problems


def read_config(argv: list[str], claim: bool = False) -> dict:
    """rule_sweep.yaml, then ``--config FILE``, then ``key=value`` overrides; raises ``ConfigError``.

    ``claim``: also refuse an ``out_dir`` that holds another sweep (unless ``--resume`` or ``--overwrite``).
    """
    return load_config(CONFIG_PATH, argv, NESTED, check, __doc__, claim=claim)


# --- the sweep ----------------------------------------------------------------------------------------
def sweep(cfg: dict, tasks: list, actions: list[str], table_dir: Path, label: str, **eval_changes) -> tuple:
    """Evaluate ``actions`` on ``tasks`` through the configured runtime, rows kept in ``table_dir``.

    ``eval_changes``: ``EvalConfig`` fields changed for this sweep (e.g. a loose tolerance). Returns
    (outcome rows labelled ``label`` or the action's name, the workers' provenance).
    """
    from autoprofiler.environments import LiveEnvironment, action_cells
    from autoprofiler.rewriters import RuleRewriter

    rule = RuleRewriter(**(cfg["rewriter_options"] or {}))
    spec = worker_spec(cfg, eval={**(cfg["eval"] or {}), **eval_changes})
    env = LiveEnvironment(rewriter=rule, table_dir=table_dir, runner=make_runner(cfg["runtime"], spec))
    cells = action_cells(tasks, rule, cfg["seeds"], actions)
    deadline = None if cfg["max_seconds"] is None else time.monotonic() + cfg["max_seconds"]
    try:
        results = env.try_outcomes(cells, deadline)
        provenance = env.runner_provenance()
    finally:
        env.close()
    rows = [outcome_row(c, r, label or c.action) for c, r in zip(cells, results, strict=True)]
    return rows, provenance


def outcome_row(cell, result, label: str) -> dict:
    """One evaluation as a table row (a cell without a row carries ``missing``: why)."""
    from autoprofiler.cells import CellFailure

    row = {"task": cell.task.id, "action": label, "seed": cell.seed}
    if isinstance(result, CellFailure):
        return {**row, "correct": False, "error_kind": result.kind, "error": result.message, "missing": "yes"}
    record = result.to_record()
    return {**row, **{k: record[k] for k in OUTCOME_FIELDS}, "missing": ""}


def summarize_actions(rows: list[dict]):
    """Per action label (first-seen order): evaluations, answered, correct, accuracy, geomean effective
    speedup (a wrong or missing candidate counts 1.0), geomean speedup over the correct ones, fast_1."""
    import polars as pl

    from autoprofiler.analysis import geomean_expr, outcome_frame, summary_frame

    frame = outcome_frame(rows, keys=("action",))
    ok = pl.col("correct").fill_null(False) & ~pl.col("missing")
    counts = frame.group_by("action", maintain_order=True).agg(
        correct=ok.sum().cast(pl.Int64), geomean_speedup_correct=geomean_expr(pl.col("speedup").filter(ok))
    )
    summary = summary_frame(frame, ["action"]).select(
        "action", pl.col("tasks").alias("evaluated"), "answered", "accuracy", "geomean_speedup", "fast_1"
    )
    return summary.join(counts, on="action", maintain_order="left").select(
        "action", "evaluated", "answered", "correct", "accuracy", "geomean_speedup",
        "geomean_speedup_correct", "fast_1",
    )  # fmt: skip


def render_markdown(rows: list[dict], header: str) -> str:
    """The per-evaluation table and the per-action summary (``summarize_actions``) as Markdown."""
    import polars as pl

    from autoprofiler.report import markdown_table

    def error(r: dict) -> str:
        text = (r.get("error_kind") or "") + (": " + r["error"][:100] if r.get("error") else "")
        return text.replace("|", "/").replace("\n", " ")

    table = pl.DataFrame(
        {
            "task": [r["task"] for r in rows],
            "action": [r["action"] for r in rows],
            "correct": ["yes" if r["correct"] else "no" for r in rows],
            "speedup": pl.Series([r.get("speedup") for r in rows], dtype=pl.Float64),
            "ref ms": pl.Series([r.get("ref_ms") for r in rows], dtype=pl.Float64),
            "new ms": pl.Series([r.get("new_ms") for r in rows], dtype=pl.Float64),
            "error": [error(r) for r in rows],
        }
    )
    return f"# {header}\n\n{markdown_table(table)}\n{markdown_table(summarize_actions(rows))}"


# --- the story ----------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    from autoprofiler.rewriters import RuleRewriter

    configure_logging()
    started = time.time()
    cfg = read_config(argv, claim=True)
    problem = environment_problem(cfg["device"], "torch", cfg["runtime"])
    if problem:
        raise EnvironmentProblem(problem)
    out = prepare_out_dir(cfg)
    print(config_line(save_config(out, cfg), cfg, SHOWN), flush=True)

    tasks, report, _ = select_tasks(resolve_path(cfg["tasks"]), cfg["filter"], cfg["max_tasks"])
    actions = list(cfg["actions"] or RuleRewriter.actions())
    print(
        f"tasks: {len(tasks)} ({len(report.errors)} failed to load); actions: {', '.join(actions)}",
        flush=True,
    )

    # 1. every (task, action) cell, then tf32 again at the loose tolerance (rows in their own table:
    # the tolerance is not part of a row's key)
    tolerance = cfg["tf32_tolerance"]
    with stage("actions"):
        rows, provenance = sweep(cfg, tasks, actions, out / "tables", "")
    if tolerance is not None and "tf32" in actions:
        with stage(f"tf32 at {tolerance:g}"):
            loose, _ = sweep(
                cfg, tasks, ["tf32"], out / f"tables_tf32_tol{tolerance:g}", f"tf32@{tolerance:g}",
                atol=float(tolerance), rtol=float(tolerance),
            )  # fmt: skip
        rows += loose

    # 2. the tables
    seconds = round(time.time() - started, 1)
    summary = summarize_actions(rows)
    header = (
        f"RuleRewriter actions on {provenance.device or cfg['device']} (torch {provenance.torch_version}, "
        f"{len(tasks)} tasks, {seconds} s)"
    )
    meta = {"config": str(out / "config.json"), "provenance": provenance.as_row(), "seconds": seconds}
    data = {**meta, "summary": summary.to_dicts(), "rows": rows}
    (out / "rule_actions.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    text = render_markdown(rows, header)
    (out / "rule_actions.md").write_text(text)
    print(text, flush=True)
    missing = sum(bool(r["missing"]) for r in rows)
    if missing:
        print(
            f"{missing} cell(s) have no row (see the error column); run again with --resume to retry them",
            flush=True,
        )
    print(f"wrote {out / 'rule_actions.json'} and {out / 'rule_actions.md'} in {seconds:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
