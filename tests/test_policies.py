"""Tests for autoprofiler.policies: every policy's select, Random determinism and budget, Oracle choice."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from conftest import FakeProfile

from autoprofiler.policies import Blind, Oracle, Random, Selection, Static, TreePolicy
from autoprofiler.tree import Step, load_tree

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
FEATURES = {"root": (SM, DRAM), "a": ("a.x",), "b": ("b.x",), "c": ("c.x",), "d": ("d.x",)}
PASSES = {"root": 9, "a": 4, "b": 5, "c": 12, "d": 1}
CONFIGURATIONS = {"first": ("a", "b"), "second": ("c",), "third": ("d",)}


@dataclass
class FakeProfiler:
    """Boundary stand-in for Profiler: every metric of a task has one fixed value; records requests."""

    values: dict = field(
        default_factory=lambda: {SM: 80.0, DRAM: 10.0, "a.x": 1.0, "b.x": 2.0, "c.x": 3.0, "d.x": 4.0}
    )
    calls: list = field(default_factory=list)

    def collect(self, task, groups):
        groups = tuple(groups)
        self.calls.append(groups)
        metrics = {m: self.values[m] for g in groups for m in FEATURES[g]}
        return FakeProfile(frozenset(groups), metrics, sum(PASSES[g] for g in groups), 0.25, FEATURES)


@dataclass(frozen=True)
class FakeTask:
    id: str
    hash: str


TASKS = [FakeTask(f"t{i}", f"{i:016x}") for i in range(40)]


def tree_dict(max_groups=2, max_passes=30):
    vocabulary = {g: {"features": list(f), "passes": PASSES[g]} for g, f in FEATURES.items()}
    return {
        "schema_version": 1, "source": "ncu", "vocabulary": vocabulary,
        "budget": {"max_depth": 2, "max_groups_per_leaf": max_groups, "max_passes_per_task": max_passes},
        "provenance": {"name": "tiny"},
        "nodes": [
            {"id": "n0", "type": "split", "feature": SM, "threshold": 60.0, "groups": ["root"],
             "children": {"left": "low", "right": "high"}},
            {"id": "low", "type": "leaf", "groups": ["c"]},
            {"id": "high", "type": "leaf", "groups": ["a", "b"]},
        ],
    }  # fmt: skip


def test_blind_collects_nothing():
    """Blind shows no groups, has no profile, spends nothing, and never calls the profiler."""
    profiler = FakeProfiler()
    selection = Blind().select(TASKS[0], profiler)
    assert selection == Selection((), None, 0, 0.0, (), None)
    assert profiler.calls == [] and selection.shown_profile() is None and Blind().name == "blind"


def test_static_by_name_and_by_groups():
    """Static collects exactly its configuration's groups in one call; names differ by configuration."""
    profiler = FakeProfiler()
    selection = Static("first", CONFIGURATIONS).select(TASKS[0], profiler)
    assert profiler.calls == [("a", "b")]
    assert (selection.groups, selection.passes, selection.seconds) == (("a", "b"), 9, 0.25)
    assert selection.trace == (("configuration", "first"),) and selection.configuration == "a+b"
    assert selection.shown_profile().metrics == {"a.x": 1.0, "b.x": 2.0}
    assert Static("first", CONFIGURATIONS).name == "static:first"
    assert Static(["d", "a", "d"]).name == "static:a+d"
    assert Static(["d", "a"]).select(TASKS[0], profiler).groups == ("d", "a")
    with pytest.raises(ValueError, match=r"unknown configuration 'fourth'; expected one of \['first'"):
        Static("fourth", CONFIGURATIONS)


def test_static_uses_catalog_configurations_by_default():
    """Static('memory') resolves through autoprofiler.profiling.groups.CONFIGURATIONS."""
    from autoprofiler.profiling.groups import CONFIGURATIONS as REAL

    assert Static("memory").groups == tuple(REAL["memory"])


def test_tree_policy_routes_and_shows_leaf_groups():
    """TreePolicy collects root then the leaf's groups, shows only the leaf's, and records the path."""
    tree = load_tree(tree_dict())
    profiler = FakeProfiler()
    selection = TreePolicy(tree).select(TASKS[0], profiler)
    assert profiler.calls == [("root",), ("a", "b")]
    assert selection.leaf == "high" and selection.groups == ("a", "b")
    assert selection.trace == (Step("n0", SM, 80.0, 60.0, "right"),)
    assert (selection.passes, selection.seconds) == (18, 0.5)
    assert set(selection.profile.metrics) == {SM, DRAM, "a.x", "b.x"}
    assert set(selection.shown_profile().metrics) == {"a.x", "b.x"}  # routing metrics are not shown
    assert TreePolicy(tree).name == f"tree:tiny@{tree.fingerprint()}"
    assert TreePolicy(tree.rewrite_leaf("low", ["d"])).name != TreePolicy(tree).name


def test_random_is_deterministic_per_seed_and_task():
    """The same (seed, task) gives the same groups whatever the order; other seeds differ somewhere."""
    tree = load_tree(tree_dict())
    first = [Random.like(tree, seed=7).draw(t) for t in TASKS]
    again = [Random.like(tree, seed=7).draw(t) for t in reversed(TASKS)][::-1]
    other = [Random.like(tree, seed=8).draw(t) for t in TASKS]
    assert first == again
    assert first != other
    assert len(set(first)) > 3  # it really varies across tasks
    assert Random.like(tree, seed=7).name == "random:7"


def test_random_respects_the_tree_budget():
    """Random.like draws 1..max_groups_per_leaf vocabulary groups whose passes fit max_passes_per_task."""
    tree = load_tree(tree_dict(max_groups=3, max_passes=21))
    policy = Random.like(tree, seed=3)
    draws = [policy.draw(t) for t in TASKS]
    assert all(1 <= len(d) <= 3 and len(set(d)) == len(d) and set(d) <= set(FEATURES) for d in draws)
    assert all(sum(PASSES[g] for g in d) <= 21 for d in draws)
    assert {len(d) for d in draws} == {1, 2, 3}
    # The same draws without the passes bound go over it somewhere: the bound really binds.
    free = [Random(policy.pool, max_groups=3, seed=3).draw(t) for t in TASKS]
    assert any(sum(PASSES[g] for g in d) > 21 for d in free)
    profiler = FakeProfiler()
    selection = policy.select(TASKS[0], profiler)
    assert profiler.calls == [draws[0]] and selection.groups == draws[0] and selection.leaf is None


def test_random_rejects_bad_arguments():
    """An empty pool or a non-positive max_groups is a ValueError naming the argument."""
    with pytest.raises(ValueError, match="pool"):
        Random([], max_groups=1)
    with pytest.raises(ValueError, match="max_groups must be a positive integer, got 0"):
        Random(["a"], max_groups=0)


def test_oracle_picks_best_recorded_configuration():
    """Oracle picks the configuration with the highest reward (ties: first listed) and collects it."""
    task, other = TASKS[0], TASKS[1]
    outcomes = {
        (task.hash, "first"): 0.1, (task.hash, "second"): 0.7, (task.hash, "third"): 0.2,
        (other.id, "first"): 0.5, (other.id, "second"): 0.5, (other.id, "third"): 0.0,
    }  # fmt: skip
    oracle = Oracle(CONFIGURATIONS, outcomes)
    profiler = FakeProfiler()
    selection = oracle.select(task, profiler)
    assert selection.groups == ("c",) and profiler.calls == [("c",)]
    assert selection.trace == (("first", 0.1), ("second", 0.7), ("third", 0.2))
    assert oracle.select(other, profiler).groups == ("a", "b")  # tie -> first listed; keyed by task id
    assert Oracle(CONFIGURATIONS, lambda t, c: {"third": 1.0}.get(c, 0.0)).select(task, profiler).groups == (
        "d",
    )
    with pytest.raises(KeyError, match=r"no recorded outcome for task 't2'.*configuration 'first'"):
        oracle.select(TASKS[2], profiler)


def test_tree_policy_select_many_matches_select():
    """select_many gives the same Selections as select, one per task, in order."""
    tree = load_tree(tree_dict())
    policy = TreePolicy(tree)
    profiler = FakeProfiler(values={SM: 10.0, DRAM: 1.0, "a.x": 1.0, "b.x": 2.0, "c.x": 3.0, "d.x": 4.0})
    many = policy.select_many(TASKS[:3], profiler)
    assert many == [policy.select(t, FakeProfiler(values=profiler.values)) for t in TASKS[:3]]
    assert [s.leaf for s in many] == ["low"] * 3
