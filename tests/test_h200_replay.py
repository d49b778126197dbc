"""The committed H200 recording replays to the same policy numbers it gave before the polars summaries.

The pinned numbers came from the code before ``analysis`` summarized with polars (commit b73a04b):
``python bench/replay_policies.py datasets/h200_suite --out /tmp/x`` (all 32 fully recorded tasks) and
``python workflows/train.py environment=replay tables=datasets/h200_suite source=ncu tree=trees/seed.json
'probe=[algorithm, memory, latency, compute]' 'task_filter=[]' max_tasks=0`` (its 11 held-out tasks and
``oracle.json``; that run accepted none of its 4 decisions, so its learned tree is the seed tree).
Here the same replay runs in-process (``ReplayEnvironment(..., runner=None)``: no Ray).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script

from autoprofiler.analysis import evaluate_policies, oracle_analysis, outcome_matrix, split_tasks
from autoprofiler.environments import ReplayEnvironment
from autoprofiler.policies import Blind, Random, Static, TreePolicy
from autoprofiler.profiling import CONFIGURATIONS, GROUPS
from autoprofiler.rewriters import RuleRewriter
from autoprofiler.tasks import load_tasks
from autoprofiler.tree import load_tree

ROOT = Path(__file__).resolve().parents[1]
PROBES = {n: tuple(CONFIGURATIONS[n]) for n in ("algorithm", "memory", "latency", "compute")}

# policy: (geomean effective speedup, mean reward, passes per task, accuracy) over the 32 tasks
BENCH = {
    "blind": (1.098774, 0.196466, 0.0, 0.875),
    "static:algorithm": (1.099096, 0.187198, 10.0, 0.875),
    "static:memory": (1.107844, 0.181565, 15.0, 0.875),
    "static:latency": (1.183504, 0.200835, 11.5, 0.90625),
    "static:compute": (1.100005, 0.18714, 12.5, 0.875),
    "seed_tree": (1.173543, 0.172442, 19.40625, 0.875),
    "oracle": (1.211176, 0.200944, 28.0, 0.90625),
}
# held-out geomean effective speedup of train.py's run (learned_tree: the seed tree, none accepted)
HELD_OUT = {
    "blind": 1.192974,
    "static:algorithm": 1.208747,
    "static:memory": 1.193201,
    "static:latency": 1.192974,
    "static:compute": 1.183773,
    "random": 1.192974,
    "seed_tree": 1.183997,
    "oracle": 1.216703,
}


@pytest.fixture(scope="module")
def replay():
    """(environment, rewriter, seed tree, the 32 tasks recorded with every group), in-process."""
    rewriter = RuleRewriter()
    env = ReplayEnvironment(ROOT / "datasets" / "h200_suite", rewriter, "ncu", runner=None)
    tasks, _ = env.fully_recorded(load_tasks(ROOT / "datasets" / "suite").tasks)
    yield env, rewriter, load_tree(ROOT / "trees" / "seed.json", catalog=GROUPS), tasks
    env.close()


def test_bench_replay_numbers(replay):
    """bench/replay_policies.py's summary: every policy on the 32 fully recorded tasks."""
    env, rewriter, tree, tasks = replay
    assert len(tasks) == 32
    policies = {
        "blind": Blind(),
        **{f"static:{n}": Static(n) for n in PROBES},
        "seed_tree": TreePolicy(tree, "seed_tree"),
        "oracle": PROBES,
    }
    _, summary = evaluate_policies(tasks, policies, env, rewriter)
    got = {
        p: tuple(summary[p][k] for k in ("geomean_speedup", "mean_reward", "passes_per_task", "accuracy"))
        for p in BENCH
    }
    for policy, expected in BENCH.items():
        assert got[policy] == pytest.approx(expected, abs=1e-6), policy


def test_train_replay_held_out_and_oracle(replay):
    """train.py's held-out policy geomeans on its hash split, and its oracle analysis over all 32 tasks."""
    env, rewriter, tree, tasks = replay
    train, test = split_tasks(tasks, 0.34)  # train.yaml's test_fraction
    assert (len(train), len(test)) == (21, 11)
    groups = sorted(
        {g for g, spec in GROUPS.items() if spec.source == "ncu"}
        & {g for t in train for g in env.profiler.recorded_groups(t)}
    )
    policies = {
        "blind": Blind(),
        **{f"static:{n}": Static(n) for n in PROBES},
        "random": Random.like(tree, seed=0, pool=groups),
        "seed_tree": TreePolicy(tree, "seed_tree"),
        "oracle": PROBES,
    }
    _, summary = evaluate_policies(test, policies, env, rewriter)
    got = {p: summary[p]["geomean_speedup"] for p in HELD_OUT}
    assert got == pytest.approx(HELD_OUT, abs=1e-6)

    oracle = oracle_analysis(outcome_matrix(test + train, PROBES, env, rewriter))
    assert oracle["tasks"] == 32 and oracle["best_static"] == "latency"
    assert oracle["relative_gain"] == pytest.approx(1.0233819081349151, abs=1e-9)
    assert oracle["relative_gain_ci"] == pytest.approx([1.0076675589788726, 1.0421944566424], abs=1e-9)


def test_bench_script_tables(tmp_path, capsys):
    """bench/replay_policies.py writes its polars tables: the summary rows and one row per task."""
    bench = load_script(ROOT / "bench" / "replay_policies.py")
    assert bench.main([str(ROOT / "datasets" / "h200_suite"), "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r.md").read_text()
    assert "| static:latency | 1.184 | 0.91 | 0.53 | 11.5 | 3.6 |" in text
    assert "| oracle | 1.211 | 0.91 | 0.56 | 28.0 | 9.6 |" in text
    assert "| suite/l1/conv2d | compute | torch_compile 0.91 | channels_last 0.95 |" in text
    assert sum(line.startswith("| suite/") for line in text.splitlines()) == 32 + 9  # full + partial tasks
    assert "## The 9 tasks recorded without every group" in text and "seed_tree" in capsys.readouterr().out
