"""Policy evaluation, the oracle sweep, refinement and the report, on the hand-made replay fixture."""

from __future__ import annotations

import math

import polars as pl
import pytest
from conftest import REPLAY_FIXTURE, load_replay_fixture

from autoprofiler.analysis import (
    beats,
    evaluate_policies,
    geomean,
    geomean_expr,
    oracle_analysis,
    outcome_matrix,
    paired_ratio,
    profile_frame,
    ratio_text,
    refine,
    reward_frame,
    split_tasks,
    summarize,
    task_devices,
)
from autoprofiler.environments import ReplayEnvironment
from autoprofiler.policies import Blind, Static, TreePolicy
from autoprofiler.profiling.groups import CONFIGURATIONS, GROUPS
from autoprofiler.report import build_report, main, markdown_table
from autoprofiler.rewards import REWARD_SCHEMA, configuration_name
from autoprofiler.rewriters.rule import RuleRewriter
from autoprofiler.tables import PROFILE_SCHEMA, ParquetTable, TableSchemaError
from autoprofiler.tasks import Task
from autoprofiler.tree import load_tree, vocabulary_from_catalog

FIXTURE = REPLAY_FIXTURE
PROBES = {k: v for k, v in CONFIGURATIONS.items() if k.startswith("torch_")}

fx = load_replay_fixture()
TASKS = fx.fixture_tasks()
HALF = len(TASKS) // 2


@pytest.fixture(scope="module")
def env():
    return ReplayEnvironment.from_dir(FIXTURE, rewriter=RuleRewriter(), source="torch")


def kind_tree():
    """The right answer for the fixture: elementwise tasks see memory, matmul tasks see launch."""
    names = ["torch_root", "torch_memory", "torch_launch"]
    return load_tree(
        {
            "schema_version": 1,
            "source": "torch",
            "vocabulary": vocabulary_from_catalog(names, GROUPS),
            "budget": {"max_depth": 2, "max_groups_per_leaf": 3, "max_passes_per_task": None},
            "provenance": {"name": "by-kind"},
            "nodes": [
                {
                    "id": "n0",
                    "type": "split",
                    "feature": "torch__matmul_time_share",
                    "threshold": 0.5,
                    "groups": ["torch_root"],
                    "children": {"left": "elementwise", "right": "matmul"},
                },
                {"id": "elementwise", "type": "leaf", "groups": ["torch_root", "torch_memory"]},
                {"id": "matmul", "type": "leaf", "groups": ["torch_root", "torch_launch"]},
            ],
        }
    )


def speed(i, action):
    return fx.action_speedup(i, action)[1]


def test_split_is_fixed_by_task_id():
    """A task's side depends on its id only: adding tasks never moves an existing one."""
    tasks = [Task.from_source(f"t/{i}", f"# {i}") for i in range(50)]
    train, test = split_tasks(tasks, 0.3)
    train2, test2 = split_tasks(tasks + [Task.from_source(f"u/{i}", "# u") for i in range(50)], 0.3)
    assert {t.id for t in test} == {t.id for t in test2 if t.id.startswith("t/")}
    assert len(train) + len(test) == 50 and 5 < len(test) < 25


def test_summarize_follows_kernelbench_fast_p():
    """fast_p is over all tasks: correct and speedup > p; wrong ones count as speedup 1 in the geomean."""
    rows = [
        {"correct": True, "speedup": 2.5, "effective_speedup": 2.5, "reward": math.log(2.5)},
        {"correct": True, "speedup": 1.2, "effective_speedup": 1.2, "reward": math.log(1.2)},
        {"correct": True, "speedup": 0.8, "effective_speedup": 0.8, "reward": 0.0},
        {"correct": False, "speedup": 3.0, "effective_speedup": 1.0, "reward": 0.0},
    ]
    s = summarize(rows)
    assert s["accuracy"] == 0.75 and s["fast_0"] == 0.75 and s["fast_1"] == 0.5
    assert s["fast_1.5"] == 0.25 and s["fast_2"] == 0.25
    assert s["geomean_speedup"] == pytest.approx(geomean([2.5, 1.2, 0.8, 1.0]))


def test_summarize_counts_missing_rows_as_wrong_and_unchanged():
    """A missing row: not correct, speedup 1.0 in the geomean, reward 0; costs still count; key order."""
    rows = [
        {"correct": True, "speedup": 4.0, "effective_speedup": 4.0, "reward": 1.0, "passes": 3},
        {
            "missing": "no row for this cell",
            "correct": True,
            "speedup": 9.0,
            "effective_speedup": 9.0,
            "reward": 5.0,
            "passes": 1,
            "profile_seconds": 2.0,
        },
    ]
    s = summarize(rows)
    assert (s["tasks"], s["answered"], s["missing"]) == (2, 1, 1)
    assert s["geomean_speedup"] == pytest.approx(2.0) and s["mean_speedup"] == pytest.approx(2.5)
    assert s["accuracy"] == 0.5 and s["fast_2"] == 0.5 and s["mean_reward"] == 0.5
    assert s["passes_per_task"] == 2.0 and s["profile_seconds_per_task"] == 1.0
    assert list(s) == [
        "tasks", "answered", "missing", "geomean_speedup", "mean_speedup", "accuracy", "mean_reward",
        "passes_per_task", "profile_seconds_per_task", "llm_calls_per_task",
        "fast_0", "fast_1", "fast_1.5", "fast_2",
    ]  # fmt: skip
    assert summarize([]) == {"tasks": 0}


def test_geomean_is_one_polars_expression():
    """geomean (a list) and geomean_expr (a column) agree; non-positive values are clipped, none is 1."""
    frame = pl.DataFrame({"g": ["a", "a", "b"], "v": [1.0, 4.0, 0.0]})
    by = dict(frame.group_by("g").agg(geomean_expr("v")).iter_rows())
    assert by["a"] == pytest.approx(geomean([1.0, 4.0])) == pytest.approx(2.0)
    assert by["b"] == pytest.approx(1e-12) and geomean([]) == 1.0


def _rows(policy: str, speedups: list[float | None]) -> list[dict]:
    """One row per task t0, t1, ...; None: a missing row."""
    return [
        {"policy": policy, "task_hash": f"t{i}", "effective_speedup": s} if s is not None
        else {"policy": policy, "task_hash": f"t{i}", "missing": "no outcome"}
        for i, s in enumerate(speedups)
    ]


def test_paired_ratio_reads_beats_only_from_an_interval_above_one():
    """The estimate is the ratio of the summaries' geomeans (a missing row counts 1.0 on both sides);
    "beats" needs the whole interval above 1: a uniform 10% lead does, one large win among ties does
    not, and a uniform loss is below 1."""
    base = _rows("static", [1.0, 2.0, 1.5, 1.2, 1.0, 1.1, 1.3, 1.0])
    lead = _rows("tree", [1.1 * r["effective_speedup"] for r in base])
    ratio = paired_ratio(lead + base, "tree", "static")
    assert ratio.estimate == pytest.approx(1.1) and ratio.low == pytest.approx(1.1) and beats(ratio)
    assert "above 1" in ratio_text(ratio) and ratio.n == 8

    one_win = _rows("tree", [4.0, 2.0, 1.5, 1.2, 1.0, 1.1, 1.3, 1.0])
    ratio = paired_ratio(one_win + base, "tree", "static")
    assert ratio.estimate > 1 and ratio.low == pytest.approx(1.0) and not beats(ratio)
    assert "holds 1" in ratio_text(ratio)

    missing = _rows("tree", [None, 1.0, 0.75, 0.6, 0.5, 0.55, 0.65, 0.5])  # t0: 1.0 against 1.0
    ratio = paired_ratio(missing + base, "tree", "static")
    tree, static = summarize(missing)["geomean_speedup"], summarize(base)["geomean_speedup"]
    assert ratio.estimate == pytest.approx(tree / static) and ratio.high < 1
    assert "below 1" in ratio_text(ratio)


def test_paired_ratio_refuses_unpaired_rows():
    base = _rows("static", [1.0, 2.0])
    with pytest.raises(ValueError, match="no rows of policy 'tree'"):
        paired_ratio(base, "tree", "static")
    with pytest.raises(ValueError, match="cover different tasks"):
        paired_ratio(base + _rows("tree", [1.0, 2.0, 3.0]), "tree", "static")


def test_evaluate_policies_on_the_fixture(env):
    """Static, blind, tree and oracle policies give the hand-computed geomeans; costs are counted."""
    policies = {
        "blind": Blind(),
        "static:torch_latency": Static("torch_latency"),
        "tree": TreePolicy(kind_tree()),
        "oracle": PROBES,
    }
    rows, summary = evaluate_policies(TASKS, policies, env)
    assert len(rows) == 4 * len(TASKS)
    blind = [speed(i, "torch_compile") for i in range(len(TASKS))]  # no profile -> default action
    graph = [speed(i, "cuda_graph") for i in range(len(TASKS))]
    best = [speed(i, "torch_compile") if i < HALF else speed(i, "cuda_graph") for i in range(len(TASKS))]
    assert summary["blind"]["geomean_speedup"] == pytest.approx(geomean(blind))
    assert summary["static:torch_latency"]["geomean_speedup"] == pytest.approx(geomean(graph))
    assert summary["tree"]["geomean_speedup"] == pytest.approx(geomean(best))
    assert summary["oracle"]["geomean_speedup"] == pytest.approx(geomean(best))
    assert summary["blind"]["profile_seconds_per_task"] == 0.0
    # the tree pays for its routing group and its leaf; the oracle for every probe's groups
    assert 0 < summary["tree"]["profile_seconds_per_task"] < summary["oracle"]["profile_seconds_per_task"]
    assert summary["tree"]["by_level"][1]["tasks"] == len(TASKS) and summary["tree"]["missing"] == 0
    devices = {r["device"] for r in rows}
    assert len(devices) == 1 and None not in devices  # every row names its task's card
    assert summary["tree"]["by_device"][devices.pop()]["tasks"] == len(TASKS)


def test_a_task_has_one_card_in_every_policys_row():
    """A task's card is the one device its answered rows name; several make it "mixed", none
    "unanswered", so per-card summaries compare policies on the same tasks."""
    rows = [
        {"task_hash": "a", "device": "NVIDIA H200"},
        {"task_hash": "a", "device": None},  # a policy the environment could not answer
        {"task_hash": "b", "device": "NVIDIA H200"},
        {"task_hash": "b", "device": "NVIDIA H100 80GB HBM3"},
        {"task_hash": "c", "device": None},
    ]
    assert task_devices(rows) == {"a": "NVIDIA H200", "b": "mixed", "c": "unanswered"}


class NamedRewriter:
    identity = "fixture-llm"


def test_unanswerable_cells_are_counted_not_dropped(env):
    """For a non-rule rewriter only recorded cells answer; the rest are rows with the reason."""
    rows, summary = evaluate_policies(
        TASKS, {"memory": Static("torch_memory")}, env, rewriter=NamedRewriter()
    )
    assert summary["memory"]["missing"] == HALF and summary["memory"]["answered"] == HALF
    assert all("fixture-llm" in r["missing"] for r in rows if r["missing"])


def test_oracle_analysis_by_hand():
    """Wins, ties, best static and the oracle's relative gain on a 3-task, 2-configuration matrix."""
    eff = {"a": [2.0, 1.0, 1.0], "b": [1.0, 2.0, 1.0]}
    matrix = [
        {"task_id": f"t{i}", "config_name": c, "effective_speedup": v[i], "correct": True, "missing": ""}
        for c, v in eff.items()
        for i in range(3)
    ]
    oa = oracle_analysis(matrix, bootstrap=500)
    assert oa["per_configuration"]["a"]["wins"] == 1 and oa["per_configuration"]["b"]["wins"] == 1
    assert oa["ties"] == 1 and oa["best_static"] == "a"
    assert oa["oracle_geomean"] == pytest.approx(4 ** (1 / 3))
    assert oa["relative_gain"] == pytest.approx(2 ** (1 / 3))
    lo, hi = oa["relative_gain_ci"]
    assert 1.0 <= lo <= hi <= 2.0
    assert oracle_analysis(pl.DataFrame(matrix), bootstrap=500) == oa  # a frame of the rows: the same


def test_oracle_analysis_skips_incomplete_tasks_and_reads_the_last_row():
    """A task missing a configuration is skipped; a cell given twice counts its last row."""
    matrix = [
        {"task_id": "t0", "config_name": "a", "effective_speedup": 1.0, "correct": True, "missing": ""},
        {"task_id": "t0", "config_name": "b", "effective_speedup": 1.0, "correct": True, "missing": ""},
        {"task_id": "t1", "config_name": "a", "effective_speedup": 2.0, "correct": True, "missing": ""},
        {"task_id": "t1", "config_name": "b", "missing": "not recorded"},
        {"task_id": "t0", "config_name": "b", "effective_speedup": 3.0, "correct": True, "missing": ""},
    ]
    oa = oracle_analysis(matrix, bootstrap=50)
    assert oa["tasks"] == 1 and oa["skipped"] == ["t1"] and oa["best_static"] == "b"
    assert oa["per_task"] == [{"task_id": "t0", "a": 1.0, "b": 3.0, "best": ["b"]}]
    assert oa["per_configuration"]["b"] == {"geomean_speedup": pytest.approx(3.0), "accuracy": 1.0, "wins": 1}


def test_oracle_sweep_on_the_fixture(env):
    """The fixture's sweep: latency wins the matmul half, the oracle beats every fixed configuration."""
    oa = oracle_analysis(outcome_matrix(TASKS, PROBES, env))
    assert oa["tasks"] == len(TASKS) and oa["skipped"] == []
    assert oa["per_configuration"]["torch_latency"]["wins"] == HALF
    assert oa["oracle_geomean"] > max(c["geomean_speedup"] for c in oa["per_configuration"].values())
    assert oa["relative_gain_ci"][0] > 1.0


def test_refinement_stops_where_the_recording_ends(env):
    """Round 0 answers from the table; round 1 was never recorded: the curve stops with the reason."""
    rows = refine(TASKS[:2], TreePolicy(kind_tree()), env, rounds=3)
    assert [r["round"] for r in rows] == [0, 1, 0, 1]
    assert rows[0]["cumulative_speedup"] == pytest.approx(speed(0, "torch_compile"))
    assert "round 1" in rows[1]["missing"] and rows[1]["cumulative_speedup"] == rows[0]["cumulative_speedup"]


def test_report_from_the_tables(tmp_path):
    """The report CLI writes Markdown and PNGs from the reward table alone; a bad folder exits 2."""
    assert main([str(FIXTURE), "--out", str(tmp_path / "r"), "--tree", "trees/seed_torch.json"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    for heading in ("## Recorded data", "## Rule actions", "## Oracle sweep (rule-v2)", "## Tree"):
        assert heading in text
    assert "```mermaid" in text and "relative gain" in text
    pngs = {p.name for p in (tmp_path / "r").glob("*.png")}
    assert {"oracle_wins_rule_v2.png", "static_speedup_rule_v2.png", "tree.png"} <= pngs
    assert "actions_rule_v1.png" in pngs
    assert main([str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2


def test_tables_read_as_polars_frames_schema_checked(tmp_path, capsys):
    """reward_frame/profile_frame: the schema's columns; a profile part in rewards/ is refused (exit 2)."""
    rewards = reward_frame(FIXTURE / "rewards")
    assert rewards.columns == REWARD_SCHEMA.names and rewards.height == 190
    assert profile_frame(FIXTURE / "profiles")["group"].n_unique() == len(fx.RECORDED_GROUPS)
    with pytest.raises(FileNotFoundError):
        reward_frame(tmp_path / "none")
    wrong = ParquetTable(tmp_path / "rec" / "rewards", PROFILE_SCHEMA, flush_every=1, writer="arrow")
    wrong.append({"key": "k", "task_hash": "h", "group": "root"})
    with pytest.raises(TableSchemaError):
        reward_frame(tmp_path / "rec" / "rewards")
    assert main([str(tmp_path / "rec"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "expected a 'reward' table" in err and "\n" not in err


def test_markdown_table_exact():
    """Floats with 3 decimals unless a format is given, nulls empty, other values as str."""
    frame = pl.DataFrame({"name": ["a", None], "x": [1.23456, float("nan")], "n": [3, 4]})
    assert markdown_table(frame, {"x": ".1f"}) == (
        "| name | x | n |\n|---|---|---|\n| a | 1.2 | 3 |\n|  | n/a | 4 |\n"
    )


def _write_rewards(directory, rows):
    """A hand-made reward table: each row a dict of the columns that matter here (rewriter rule-v1)."""
    table = ParquetTable(directory / "rewards", REWARD_SCHEMA, flush_every=10_000, writer="arrow")
    for i, r in enumerate(rows):
        eff = r["speedup"] if r.get("correct", True) else 1.0
        table.append(
            {
                "key": f"k{i}",
                "task_id": r["task"],
                "task_hash": r["task"],
                "level": 1,
                "kind": "action" if "action" in r else "configuration",
                "configuration": configuration_name(CONFIGURATIONS[r["config"]]) if "config" in r else "",
                "rewriter": "rule-v1",
                "seed": 0,
                "round": 0,
                "action": r.get("action", "keep"),
                "correct": r.get("correct", True),
                "speedup": r["speedup"],
                "effective_speedup": eff,
                "reward": math.log(eff) if eff > 1 else 0.0,
                "run_id": "hand",
            }
        )
    table.close()


HAND_ACTIONS = [
    {"task": "t0", "action": "keep", "speedup": 1.0},
    {"task": "t0", "action": "cuda_graph", "speedup": 1.5},
    {"task": "t1", "action": "keep", "speedup": 1.2},
    {"task": "t1", "action": "cuda_graph", "speedup": 0.8},
    {"task": "t2", "action": "cuda_graph", "speedup": 0.25},  # keep never recorded on t2
]


def test_report_states_only_what_the_tables_show(tmp_path):
    """Actions not recorded on every task: no "evaluated on every task", no one bound over all of them;
    each action against the best action per task on its own tasks (never below it); an all-tie sweep
    draws no wins chart and says so."""
    _write_rewards(
        tmp_path,
        [
            *HAND_ACTIONS,
            *[
                {"task": t, "config": c, "speedup": s}
                for t, s in (("t0", 1.5), ("t1", 1.2))
                for c in ("memory", "latency")
            ],
        ],
    )
    text = build_report(tmp_path, tmp_path / "out").read_text()
    assert "2 actions over 3 tasks; 2 of the tasks have a row for every action" in text
    assert "evaluated once on each of" not in text and "an upper bound" not in text
    # keep on t0, t1: sqrt(1.0 * 1.2) vs the per-task best there sqrt(1.5 * 1.2); cuda_graph on all three:
    # (1.5 * 0.8 * 0.25) ** (1/3) vs (1.5 * 1.2 * 0.25) ** (1/3)
    assert "cuda_graph 0.669x vs 0.766x (3 tasks), keep 1.095x vs 1.342x (2 tasks)" in text
    assert "strictly best on: cuda_graph 1, keep 1; several tie for best on 0" in text
    assert "| keep | 2 | 2 | 1.000 | 1.095 | 0.500 | - | 1.342 |" in text
    assert "No configuration is strictly best on any task (ties: 2 of 2), so there is no wins chart" in text
    assert "Best static: **memory** (1.342x; tied with latency)" in text
    pngs = {p.name for p in (tmp_path / "out").glob("*.png")}
    assert pngs == {"actions_rule_v1.png", "static_speedup_rule_v1.png"}


def test_best_action_per_task_is_never_below_an_action_on_its_tasks(env):
    """Per task the best recorded action (a missing one not counted); on every action's own tasks its
    geomean is at least that action's, on the hand rows and on the fixture's recorded actions."""
    from autoprofiler.report import best_action_per_task

    hand = pl.DataFrame(HAND_ACTIONS).rename({"task": "task_hash", "speedup": "effective_speedup"})
    best = best_action_per_task(hand)
    assert best.rows() == [
        ("t0", 1.5, 2, ["cuda_graph"]),
        ("t1", 1.2, 2, ["keep"]),
        ("t2", 0.25, 1, ["cuda_graph"]),
    ]
    actions = reward_frame(FIXTURE / "rewards").filter(pl.col("kind") == "action")
    per_task = best_action_per_task(actions)
    joined = actions.join(per_task, on="task_hash")
    checked = joined.group_by("action").agg(
        geomean_expr("effective_speedup").alias("alone"), geomean_expr("best").alias("best")
    )
    assert checked.height >= 2 and (checked["best"] >= checked["alone"] - 1e-12).all()


def test_a_report_replaces_the_previous_one_whole(tmp_path):
    """A second report into the same folder removes the charts of the first that it does not draw; the
    CLI refuses a folder holding a report, or one git tracks, unless --overwrite."""
    _write_rewards(tmp_path / "a", [{"task": t, "config": "memory", "speedup": 1.5} for t in ("t0", "t1")]
                   + [{"task": "t0", "config": "latency", "speedup": 1.0},
                      {"task": "t1", "config": "latency", "speedup": 2.0}])  # fmt: skip
    _write_rewards(
        tmp_path / "b", [{"task": "t0", "config": c, "speedup": 1.0} for c in ("memory", "latency")]
    )
    build_report(tmp_path / "a", tmp_path / "out")
    assert (tmp_path / "out" / "oracle_wins_rule_v1.png").exists()  # memory wins t0, latency t1
    build_report(tmp_path / "b", tmp_path / "out")  # one task, a tie: no wins chart
    assert not (tmp_path / "out" / "oracle_wins_rule_v1.png").exists()
    assert main([str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 2
    assert main([str(tmp_path / "b"), "--out", str(tmp_path / "out"), "--overwrite"]) == 0


def test_report_out_in_a_tracked_folder_is_refused(tmp_path, capsys):
    """``--out reports/x`` in this checkout: git would show the files as untracked; runs/ is ignored."""
    import shutil

    from autoprofiler.report import out_problem, tracked_folder

    repo = FIXTURE.parents[2]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    assert tracked_folder(repo / "reports" / "never_written") and not tracked_folder(repo / "runs" / "x")
    assert "write under runs/" in out_problem(repo / "reports" / "never_written", overwrite=False)
    assert out_problem(repo / "reports" / "never_written", overwrite=True) is None
    assert not tracked_folder(tmp_path / "r")


def test_report_of_a_run_covers_its_tasks_only(tmp_path):
    """``tasks=``: the tables' rows of other tasks are left out, and the report says it is restricted."""
    _write_rewards(tmp_path, HAND_ACTIONS)
    text = build_report(tmp_path, tmp_path / "out", tasks=["t0", "t1"]).read_text()
    assert "restricted to the 2 tasks of this run" in text and "| reward rows | 4 |" in text
    assert "Each of the 2 actions was evaluated once on each of the 2 tasks" in text
    assert "Best action per task, over the 2 tasks: geomean 1.342x, an upper bound" in text
    assert "the best single action gives 1.095x (cuda_graph = keep)" in text  # sqrt(1.5*0.8) = sqrt(1.2)


def test_report_with_a_training_run(tmp_path, env):
    """With a run folder the report adds the policy table, the learning log and the refinement curve."""
    import json

    from autoprofiler.learning import LearnConfig, Learner, StatisticalProposer

    run = tmp_path / "run"
    learner = Learner(
        env,
        TASKS,
        StatisticalProposer(),
        LearnConfig(),
        out_dir=run,
        catalog=GROUPS,
        probe_configurations=PROBES,
        groups=list(fx.RECORDED_GROUPS),
    )
    tree = learner.fit(kind_tree())
    rows, summary = evaluate_policies(TASKS, {"tree": TreePolicy(tree), "oracle": PROBES}, env)
    (run / "evaluation.json").write_text(json.dumps({"tasks": len(TASKS), "summary": summary, "rows": rows}))
    ref = refine(TASKS[:3], TreePolicy(tree), env, rounds=2)
    (run / "refinement.json").write_text(json.dumps({"rows": ref}))
    text = build_report(FIXTURE, tmp_path / "one", run_dir=run).read_text()
    assert "Only round 0 was answered, so there is no refinement curve" in text  # the replay stops at 0
    assert not (tmp_path / "one" / "refinement.png").exists()
    # a second round, as a live run answers it, makes a curve
    ref += [
        {**r, "round": 1, "cumulative_speedup": 1.1 * r["cumulative_speedup"], "cumulative_seconds": 2.0}
        for r in ref
        if not r["missing"]
    ]
    (run / "refinement.json").write_text(json.dumps({"rows": ref}))
    path = build_report(FIXTURE, tmp_path / "out", run_dir=run)
    text = path.read_text()
    assert "## Policies on held-out tasks" in text and "## Learning log" in text
    assert "## Iterative refinement" in text and (tmp_path / "out" / "refinement.png").exists()
    assert (tmp_path / "out" / "policy_speedup.png").exists()
