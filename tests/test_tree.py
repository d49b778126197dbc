"""Tests for autoprofiler.tree: load/validate, routing (sequential collection), edits, exports."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import FakeProfile

from autoprofiler.tree import (
    Leaf,
    ProfilingTree,
    RouteError,
    Split,
    Step,
    TreeError,
    export_mermaid,
    export_text,
    load_tree,
    save_tree,
    tree_problems,
)

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
HIT = "lts__t_sector_hit_rate.pct"
STALL = "smsp__average_warp_latency_per_inst_issued.ratio"
FMA = "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
TREES = Path(__file__).resolve().parent.parent / "trees"


def small_tree_dict() -> dict:
    """Root on SM; the low-SM side splits on DRAM (same group: no new collection), the high side is a leaf.

    n0: SM <= 60 ? -> n1 : compute
    n1: DRAM <= 30 ? -> latency : memory
    """
    return {
        "schema_version": 1,
        "source": "ncu",
        "vocabulary": {
            "root": {"features": [SM, DRAM], "passes": 9},
            "memory": {"features": [HIT], "passes": 9},
            "stalls": {"features": [STALL], "passes": 9},
            "compute": {"features": [FMA], "passes": 11},
        },
        "budget": {"max_depth": 3, "max_groups_per_leaf": 2, "max_passes_per_task": 30},
        "provenance": {"name": "small"},
        "nodes": [
            {"id": "n0", "type": "split", "feature": SM, "threshold": 60, "groups": ["root"],
             "children": {"left": "n1", "right": "compute"}},
            {"id": "n1", "type": "split", "feature": DRAM, "threshold": 30.0, "groups": ["root"],
             "children": {"left": "latency", "right": "memory"}},
            {"id": "latency", "type": "leaf", "groups": ["stalls"], "label": "latency"},
            {"id": "memory", "type": "leaf", "groups": ["memory"]},
            {"id": "compute", "type": "leaf", "groups": ["compute"]},
        ],
    }  # fmt: skip


@dataclass
class FakeProfiler:
    """Boundary stand-in for Profiler: fixed metric values per task id; records every request."""

    values: dict  # task id -> {metric: value}
    calls: list = field(default_factory=list)
    FEATURES = {"root": [SM, DRAM], "memory": [HIT], "stalls": [STALL], "compute": []}
    PASSES = {"root": 9, "memory": 9, "stalls": 9, "compute": 11}

    def collect(self, task, groups):
        groups = list(groups)
        self.calls.append((task.id, tuple(groups)))
        metrics = {
            m: self.values[task.id][m] for g in groups for m in self.FEATURES[g] if m in self.values[task.id]
        }
        return FakeProfile(
            frozenset(groups), metrics, sum(self.PASSES[g] for g in groups), 0.5 * len(groups), self.FEATURES
        )


@dataclass(frozen=True)
class FakeTask:
    id: str
    hash: str = "0" * 16


VALUES = {
    "idle": {SM: 10.0, DRAM: 5.0, HIT: 50.0, STALL: 20.0},  # -> latency
    "stream": {SM: 20.0, DRAM: 85.0, HIT: 10.0, STALL: 9.0},  # -> memory
    "gemm": {SM: 90.0, DRAM: 40.0, HIT: 80.0, STALL: 4.0},  # -> compute
    "edge": {SM: 60.0, DRAM: 30.0, HIT: 1.0, STALL: 1.0},  # thresholds are inclusive on the left -> latency
}


# --- load / validate -------------------------------------------------------------------------------------
def test_load_valid_tree_builds_nodes_in_order():
    """A valid dict loads into Split/Leaf dataclasses with node 0 as the root and float thresholds."""
    tree = load_tree(small_tree_dict())
    assert tree.root == Split("n0", SM, 60.0, ("root",), "n1", "compute")
    assert tree.leaf("latency") == Leaf("latency", ("stalls",), "latency")
    assert tree.leaf_ids == ("latency", "memory", "compute")
    assert tree.depth == 2
    assert tree.groups_on_path("memory") == ("root", "memory")


def _mutate(fn):
    d = small_tree_dict()
    fn(d)
    return d


MALFORMED = [
    ("missing child", lambda d: d["nodes"][1]["children"].update(right="n9"),
     "nodes[1].children.right: node 'n9' does not exist"),
    ("non-numeric threshold", lambda d: d["nodes"][0].update(threshold="60"),
     "nodes[0].threshold: expected a finite number, got '60' (str)"),
    ("nan threshold", lambda d: d["nodes"][0].update(threshold=float("nan")),
     "nodes[0].threshold: expected a finite number"),
    ("unknown group", lambda d: d["nodes"][3].update(groups=["memory", "tensor"]),
     "nodes[3].groups[1]: unknown group 'tensor'"),
    ("feature of an undeclared group", lambda d: d["nodes"][1].update(feature=HIT),
     f"nodes[1].feature: '{HIT}' is not in the groups this node declares (root); it is in: memory"),
    ("unknown feature", lambda d: d["nodes"][0].update(feature="sm__nope"),
     "nodes[0].feature: unknown feature 'sm__nope' (not in any vocabulary group)"),
    ("duplicate id", lambda d: d["nodes"][4].update(id="memory"),
     "nodes[4].id: duplicate id 'memory' (first at nodes[3])"),
    ("cycle back to the root", lambda d: d["nodes"][1]["children"].update(left="n0"),
     "nodes[1].children.left: 'n0' points back to the root (cycle)"),
    ("two parents", lambda d: d["nodes"][1]["children"].update(left="compute"),
     "nodes[1].children.left: node 'compute' already has parent 'n0'"),
    ("unreachable node", lambda d: d["nodes"].append({"id": "orphan", "type": "leaf", "groups": []}),
     "nodes[5]: node 'orphan' is unreachable from the root 'n0'"),
    ("depth budget", lambda d: d["budget"].update(max_depth=1),
     "nodes[2]: leaf 'latency' is at depth 2 > budget.max_depth 1 (n0 > n1 > latency)"),
    ("groups per leaf budget", lambda d: d["nodes"][4].update(groups=["compute", "memory", "stalls"]),
     "nodes[4].groups: leaf 'compute' has 3 groups > budget.max_groups_per_leaf 2"),
    ("passes budget",  # root 9 + compute 11 + memory 9 = 29 passes on the path to 'compute'
     lambda d: (d["nodes"][4].update(groups=["compute", "memory"]),
                d["budget"].update(max_passes_per_task=28)),
     "nodes[4]: path to leaf 'compute' costs 29 passes > budget.max_passes_per_task 28 "
     "(n0 > compute; groups root, compute, memory)"),
    ("bad source", lambda d: d.update(source="nsys"), "source: expected one of ['ncu', 'torch'], got 'nsys'"),
    ("bad version", lambda d: d.update(schema_version=2), "schema_version: expected 1, got 2"),
    ("unknown top key", lambda d: d.update(extra=1), "extra: unknown key"),
    ("unknown node key", lambda d: d["nodes"][2].update(threshold=3),
     "nodes[2].threshold: unknown key for a leaf node"),
    ("bad budget", lambda d: d["budget"].update(max_depth=-1),
     "budget.max_depth: expected a non-negative integer"),
    ("bad node type", lambda d: d["nodes"][2].update(type="node"),
     "nodes[2].type: expected one of ['split', 'leaf']"),
    ("bad passes", lambda d: d["vocabulary"]["root"].update(passes="9"),
     "vocabulary.root.passes: expected a non-negative integer or null, got '9' (str)"),
]  # fmt: skip


@pytest.mark.parametrize("case,mutate,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_tree_names_json_path(case, mutate, expected):
    """Each malformed tree raises TreeError whose problems include one starting with the expected text."""
    with pytest.raises(TreeError) as info:
        load_tree(_mutate(mutate))
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems
    assert expected.split(":")[0] in str(info.value)


def test_all_problems_reported_at_once():
    """Several independent problems come back together in one TreeError, in document order."""

    def breakit(d):
        d["nodes"][0]["threshold"] = None
        d["nodes"][3]["groups"] = ["nope"]
        d["budget"]["max_groups_per_leaf"] = "two"

    with pytest.raises(TreeError) as info:
        load_tree(_mutate(breakit))
    paths = [p.split(":")[0] for p in info.value.problems]
    assert paths == ["budget.max_groups_per_leaf", "nodes[0].threshold", "nodes[3].groups[0]"]
    assert "3 problem(s)" in str(info.value)


def test_valid_tree_has_no_problems_and_non_object_is_rejected():
    """tree_problems returns [] for a valid tree and a top-level problem for a non-object."""
    assert tree_problems(small_tree_dict()) == []
    assert tree_problems([1, 2]) == ["(top): expected a JSON object, got list"]


def test_catalog_check_names_unknown_groups_and_features():
    """With a catalog, vocabulary groups/features absent from it (or of another source) are problems."""

    @dataclass(frozen=True)
    class G:
        metrics: tuple
        source: str = "ncu"
        passes: int | None = None

    catalog = {"root": G((SM, DRAM)), "memory": G(()), "stalls": G((STALL,), "torch"), "compute": G(())}
    catalog.pop("compute")
    with pytest.raises(TreeError) as info:
        load_tree(small_tree_dict(), catalog=catalog)
    assert info.value.problems == [
        f"vocabulary.memory.features[0]: '{HIT}' is not a metric of catalog group 'memory'",
        "vocabulary.stalls: catalog group 'stalls' has source 'torch', the tree 'ncu'",
        "vocabulary.compute: group 'compute' is not in the metric catalog",
    ]


def test_load_from_file_and_bad_json(tmp_path):
    """load_tree reads a path; a file that is not JSON is a TreeError naming the file."""
    path = save_tree(load_tree(small_tree_dict()), tmp_path / "t" / "tree.json")
    assert load_tree(path).to_dict() == load_tree(small_tree_dict()).to_dict()
    bad = tmp_path / "bad.json"
    bad.write_text("{nodes: ")
    with pytest.raises(TreeError, match=r"(?s)bad.json.*not valid JSON"):
        load_tree(bad)


def test_round_trip_gives_same_routes():
    """tree -> JSON -> tree is equal and routes every task to the same leaf with the same path."""
    tree = load_tree(small_tree_dict())
    again = load_tree(json.loads(tree.to_json()))
    assert again == tree
    assert again.to_json() == tree.to_json()
    for name, values in VALUES.items():
        assert again.decision_path(values) == tree.decision_path(values), name


def test_fingerprint_tracks_routing_only():
    """fingerprint changes with a threshold or a leaf's groups, not with provenance or budget."""
    base = load_tree(small_tree_dict()).fingerprint()
    assert load_tree(_mutate(lambda d: d["provenance"].update(name="other"))).fingerprint() == base
    assert load_tree(_mutate(lambda d: d["budget"].update(max_depth=9))).fingerprint() == base
    assert load_tree(_mutate(lambda d: d["nodes"][0].update(threshold=61))).fingerprint() != base
    assert load_tree(small_tree_dict()).rewrite_leaf("memory", ["stalls"]).fingerprint() != base


# --- routing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "task,leaf", [("idle", "latency"), ("stream", "memory"), ("gemm", "compute"), ("edge", "latency")]
)
def test_apply_routes_on_metrics(task, leaf):
    """apply() sends value <= threshold left and > threshold right."""
    assert load_tree(small_tree_dict()).apply(VALUES[task]) == leaf


def test_route_collects_sequentially_and_nothing_else():
    """route() asks for the root's groups, then only what is new per node, then the leaf's; then stops."""
    tree = load_tree(small_tree_dict())
    profiler = FakeProfiler(VALUES)
    route = tree.route(FakeTask("stream"), profiler)
    # n1 needs "root" again, which is already collected: no call for it.
    assert profiler.calls == [("stream", ("root",)), ("stream", ("memory",))]
    assert route.leaf == "memory"
    assert route.path == (Step("n0", SM, 20.0, 60.0, "left"), Step("n1", DRAM, 85.0, 30.0, "right"))
    assert route.groups == ("root", "memory")
    assert route.leaf_groups == ("memory",)
    assert (route.passes, route.seconds) == (18, 1.0)
    assert route.profile.metrics == {SM: 20.0, DRAM: 85.0, HIT: 10.0}


def test_route_collects_split_groups_before_reading_them():
    """A node deeper in the tree that needs a new group gets it collected before its feature is read."""
    tree = load_tree(small_tree_dict()).split_leaf("memory", HIT, 50.0, right_groups=["stalls"])
    profiler = FakeProfiler(VALUES)
    route = tree.route(FakeTask("stream"), profiler)  # HIT 10 <= 50 -> memory.le
    assert profiler.calls == [("stream", ("root",)), ("stream", ("memory",))]  # the split reuses 'memory'
    assert route.leaf == "memory.le"
    assert route.path[-1] == Step("memory", HIT, 10.0, 50.0, "left")


def test_route_missing_feature_is_clear_error():
    """A feature absent from the collected profile raises RouteError naming the node, feature and task."""
    tree = load_tree(small_tree_dict())
    profiler = FakeProfiler({"t": {SM: 10.0}})  # DRAM never measured
    with pytest.raises(RouteError, match=rf"node 'n1' routes on '{DRAM}'.*task 't'.*\['root'\]"):
        tree.route(FakeTask("t"), profiler)
    with pytest.raises(RouteError, match="is NaN"):
        tree.apply({SM: float("nan")})


@dataclass
class FakeBatchProfiler(FakeProfiler):
    """FakeProfiler with batch mode: collect_many records (task ids, groups); fails if a task is 'broken'."""

    batches: list = field(default_factory=list)

    def collect_many(self, tasks, groups):
        self.batches.append((tuple(t.id for t in tasks), tuple(groups)))
        if any(t.id == "broken" for t in tasks):
            raise RuntimeError("program crashed")
        return [self.collect(t, groups) for t in tasks]

    def collect(self, task, groups):
        if task.id == "broken":
            raise RuntimeError("program crashed")
        return super().collect(task, groups)


def test_route_many_batches_and_matches_route():
    """route_many gives each task the Route that route() gives, sharing one batch per (step, groups)."""
    tree = load_tree(small_tree_dict())
    tasks = [FakeTask(name) for name in VALUES]  # idle, stream, gemm, edge
    profiler = FakeBatchProfiler(VALUES)
    routes = tree.route_many(tasks, profiler)
    assert routes == [tree.route(t, FakeProfiler(VALUES)) for t in tasks]
    assert profiler.batches == [
        (("idle", "stream", "gemm", "edge"), ("root",)),  # the root, for everyone at once
        # then each leaf's groups (gemm reached its leaf one level earlier: a single task, no batch)
        (("idle", "edge"), ("stalls",)),
    ]
    assert ("gemm", ("compute",)) in profiler.calls and ("stream", ("memory",)) in profiler.calls


def test_route_many_failures_are_data():
    """A task that crashes or lacks a feature gets its exception; the others still get routes."""
    tree = load_tree(small_tree_dict())
    values = {**VALUES, "nodram": {SM: 10.0}}
    tasks = [FakeTask("idle"), FakeTask("broken"), FakeTask("nodram"), FakeTask("gemm")]
    routes = tree.route_many(tasks, FakeBatchProfiler(values))
    assert [r.leaf for r in (routes[0], routes[3])] == ["latency", "compute"]
    assert isinstance(routes[1], RuntimeError) and "crashed" in str(routes[1])
    assert isinstance(routes[2], RouteError) and "node 'n1'" in str(routes[2])


# --- edits -----------------------------------------------------------------------------------------------
def test_rewrite_leaf_returns_new_tree_and_keeps_incumbent():
    """rewrite_leaf adds groups (no duplicates) on a copy; the incumbent's JSON is unchanged."""
    tree = load_tree(small_tree_dict())
    before = tree.to_json()
    new = tree.rewrite_leaf("memory", ["stalls", "memory"])
    assert new.leaf("memory").groups == ("memory", "stalls")
    assert tree.leaf("memory").groups == ("memory",)
    assert tree.to_json() == before
    with pytest.raises(KeyError, match="split node, not a leaf"):
        tree.rewrite_leaf("n0", ["stalls"])


def test_split_leaf_defaults_and_incumbent_unchanged():
    """split_leaf keeps the leaf's id on the split, children default to the parent's groups."""
    tree = load_tree(small_tree_dict())
    before = copy.deepcopy(tree.to_dict())
    new = tree.split_leaf("compute", DRAM, 50.0)
    assert new.node("compute") == Split("compute", DRAM, 50.0, ("root",), "compute.le", "compute.gt")
    assert new.leaf("compute.le").groups == new.leaf("compute.gt").groups == ("compute",)
    assert new.depth == 2 and tree.to_dict() == before
    assert new.apply(VALUES["gemm"]) == "compute.le"


def test_split_leaf_picks_feature_group_and_extends_vocabulary_from_catalog():
    """The split node collects a group holding the feature; a catalog supplies groups the tree lacks."""

    @dataclass(frozen=True)
    class G:
        metrics: tuple
        passes: int
        source: str = "ncu"

    tree = load_tree(small_tree_dict())
    new = tree.split_leaf("latency", "launch__waves_per_multiprocessor", 1.0,
                          catalog={"launch": G(("launch__waves_per_multiprocessor",), 1)})  # fmt: skip
    assert new.node("latency").groups == ("launch",)
    assert new.vocabulary["launch"].passes == 1
    with pytest.raises(TreeError, match="not a feature of any known group"):
        tree.split_leaf("latency", "launch__waves_per_multiprocessor", 1.0)


def test_edits_enforce_budget():
    """Edits that exceed the budget raise TreeError and leave the incumbent valid and unchanged."""
    tree = load_tree(small_tree_dict())
    with pytest.raises(TreeError, match="max_groups_per_leaf 2"):
        tree.rewrite_leaf("memory", ["stalls", "compute"])
    with pytest.raises(TreeError, match="depth 4 > budget.max_depth 3"):
        tree.split_leaf("latency", DRAM, 10.0).split_leaf("latency.le", SM, 5.0)
    with pytest.raises(TreeError, match="costs 38 passes > budget.max_passes_per_task 30"):
        tree.rewrite_leaf("compute", ["stalls"]).split_leaf("compute", HIT, 1.0)
    with pytest.raises(TreeError, match="duplicate id 'memory'"):
        tree.split_leaf("latency", DRAM, 1.0, left_id="memory")
    assert tree.to_dict() == load_tree(small_tree_dict()).to_dict()


def test_trees_are_validated_when_built_directly():
    """Constructing a ProfilingTree from dataclasses runs the same validation."""
    tree = load_tree(small_tree_dict())
    with pytest.raises(TreeError, match=r"nodes\[0\].children.right: node 'gone' does not exist"):
        nodes = (Split("n0", SM, 1.0, ("root",), "x", "gone"), Leaf("x", ()))
        ProfilingTree(tree.source, tree.vocabulary, tree.budget, nodes)


# --- exports ---------------------------------------------------------------------------------------------
def test_export_text_exact():
    """export_text matches sklearn's layout exactly."""
    expected = (
        f"|--- {SM} <= 60.00\n"
        f"|   |--- {DRAM} <= 30.00\n"
        "|   |   |--- leaf latency: stalls\n"
        f"|   |--- {DRAM} >  30.00\n"
        "|   |   |--- leaf memory: memory\n"
        f"|--- {SM} >  60.00\n"
        "|   |--- leaf compute: compute\n"
    )
    assert export_text(load_tree(small_tree_dict())) == expected


def test_export_text_options_and_single_leaf():
    """decimals and show_split_groups change the split lines; a lone empty leaf prints (none)."""
    tree = load_tree(small_tree_dict())
    assert (
        export_text(tree, decimals=0, show_split_groups=True).splitlines()[0]
        == f"|--- {SM} <= 60  [collect: root]"
    )
    lone = ProfilingTree("ncu", {}, tree.budget, (Leaf("only", ()),))
    assert export_text(lone) == "|--- leaf only: (none)\n"


def test_export_mermaid():
    """export_mermaid draws every node once and two labelled edges per split."""
    text = export_mermaid(load_tree(small_tree_dict()))
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert f'    N0{{"{SM}<br/>collect: root"}}' in lines
    assert '    N2["leaf latency<br/>stalls"]' in lines
    assert '    N0 -->|"≤ 60.00"| N1' in lines and '    N0 -->|"> 60.00"| N4' in lines
    assert sum("-->" in line for line in lines) == 4


# --- shipped trees ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["seed.json", "seed_torch.json"])
def test_shipped_trees_validate_against_catalog(name):
    """Every shipped tree loads against the real catalog; its leaves hold the four fixed configurations."""
    from autoprofiler.profiling.groups import CONFIGURATIONS, GROUPS

    tree = load_tree(TREES / name, catalog=GROUPS)
    prefix = "torch_" if tree.source == "torch" else ""
    configurations = {tree.leaf(leaf).label: tree.leaf(leaf).groups for leaf in tree.leaf_ids}
    assert set(configurations) == {f"{prefix}{c}" for c in ("algorithm", "memory", "latency", "compute")}
    for label, groups in configurations.items():
        assert groups == tuple(CONFIGURATIONS[label]), label


# --- integration: the real profiler (torch source on CPU; ncu on the H200) -------------------------------
SUITE = Path(__file__).resolve().parent.parent / "datasets" / "suite"


@pytest.fixture(scope="module")
def profile_cache_dir(tmp_path_factory):
    """One profile cache for the integration tests below, so each task is profiled once."""
    return tmp_path_factory.mktemp("profile_cache")


def test_route_with_real_torch_profiler(profile_cache_dir):
    """The seed torch tree routes a suite task with the real Profiler, consistently with apply()."""
    from autoprofiler.profiling import GROUPS, Profile, ProfileCache, Profiler
    from autoprofiler.tasks import load_task_file

    tree = load_tree(TREES / "seed_torch.json", catalog=GROUPS)
    task = load_task_file(SUITE / "l1" / "matmul_square.py")
    profiler = Profiler(
        source="torch", device="cpu", task_size="small", cache=ProfileCache(profile_cache_dir)
    )
    route = tree.route(task, profiler)
    assert isinstance(route.profile, Profile)
    assert route.groups[0] == "torch_root" and set(route.groups) <= set(route.profile.groups)
    assert [s.node for s in route.path] == ["n0", "n1"] and route.leaf == "compute"  # a matmul: compute
    assert tree.apply(route.profile) == route.leaf
    assert route.path[1].value == route.profile.metrics["torch__matmul_time_share"] > 0.5
    shown = route.profile.restrict(route.leaf_groups)
    assert set(shown.metrics) <= {m for g in route.leaf_groups for m in GROUPS[g].metrics}


def test_cli_route_prints_path_and_leaf(profile_cache_dir, capsys):
    """`autoprofiler route TASK --json` prints the leaf, the path with values and what was collected."""
    from autoprofiler.cli import main

    task = str(SUITE / "l1" / "matmul_square.py")
    assert main(["route", task, "--cache", str(profile_cache_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["leaf"] == "compute" and out["collected"] == ["torch_root", "torch_flops"]
    assert [s["feature"] for s in out["path"]] == [
        "torch__elementwise_time_share",
        "torch__matmul_time_share",
    ]
    assert main(["route", task, "--tree", str(TREES / "seed.json"), "--source", "torch"]) == 2
    assert "routes on 'ncu' features but --source is 'torch'" in capsys.readouterr().err


def test_cli_optimize_one_task_end_to_end(profile_cache_dir, tmp_path, capsys):
    """`optimize` on CPU: route, show the leaf's groups to the rule rewriter, evaluate, save the table.

    matmul_square routes to the compute leaf, which shows torch_root (matmul/elementwise shares): the
    rule rewriter sees one library matmul and keeps it, a candidate the evaluator finds correct.
    """
    from autoprofiler.cli import main

    task = str(SUITE / "l1" / "matmul_square.py")
    out = tmp_path / "table.md"
    args = ["optimize", task, "--cache", str(profile_cache_dir), "--trials", "5", "--json", "--out", str(out)]
    code = main(args)
    row = json.loads(capsys.readouterr().out)
    assert (row["leaf"], row["groups"], row["action"]) == ("compute", "torch_root+torch_flops", "keep")
    assert row["correct"] and code == 0 and row["speedup"] > 0 and row["llm_calls"] == 0
    assert [step[:2] for step in row["path"]] == [["n0", "torch__elementwise_time_share"],
                                                  ["n1", "torch__matmul_time_share"]]  # fmt: skip
    table = out.read_text()
    assert (
        "| task | leaf | groups |" in table
        and "| matmul_square | compute | torch_root+torch_flops |" in table
    )


def test_cli_optimize_with_openai_rewriter_on_loopback(profile_cache_dir, capsys, monkeypatch):
    """`optimize --rewriter openai` makes one chat call whose prompt shows the leaf's groups only."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    from openai_server import OpenAIServer, ok

    from autoprofiler.cli import main

    answer = (
        "Here it is:\n```python\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n\n"
        "    def forward(self, A, B):\n        return A @ B\n```\n"
    )
    task = str(SUITE / "l1" / "matmul_square.py")
    with OpenAIServer() as server:
        server.script(ok(answer))
        args = ["optimize", task, "--cache", str(profile_cache_dir), "--trials", "5", "--json",
                "--rewriter", "openai", "--base-url", server.base_url, "--model", "test-model"]  # fmt: skip
        code = main(args)
        prompt = server.requests[0].content("user")
    row = json.loads(capsys.readouterr().out)
    assert len(server.requests) == 1 and row["llm_calls"] == 1 and row["prompt_tokens"] > 0
    assert row["correct"] and code == 0 and row["leaf"] == "compute"
    assert "torch__flop_count" in prompt  # torch_flops: shown by the compute leaf
    assert "torch__launch_overhead_share" not in prompt and "torch__io_bytes" not in prompt  # not shown


def test_optimize_shard_splits_tasks():
    """--shard K/N keeps every N-th task from K; a malformed spec is a bad-input stop."""
    from autoprofiler.cli import _shard, _Stop

    tasks = list(range(7))
    assert _shard(tasks, None) == tasks
    assert _shard(tasks, "0/3") == [0, 3, 6] and _shard(tasks, "2/3") == [2, 5]
    for bad in ("3/3", "a/b", "1"):
        with pytest.raises(_Stop, match="--shard must be K/N"):
            _shard(tasks, bad)


def test_optimize_summary_and_json_table(tmp_path):
    """Suite summary: accuracy, geomean effective speedup (wrong counts 1.0), fast_p over the evaluated
    tasks; a task that failed before evaluation is counted apart; JSON keeps the rows."""
    from autoprofiler.cells import Cell, RewardRow
    from autoprofiler.cli import _summary, _write_table
    from autoprofiler.optimize import Optimized, result_row
    from autoprofiler.tasks import Task

    a, b, c = (Task.from_source(f"t/{n}", f"# {n}") for n in "abc")
    fast = RewardRow.build(Cell(a, (), "r"), correct=True, speedup=2.0)
    wrong = RewardRow.build(Cell(b, (), "r"), correct=False, speedup=8.0)
    results = [
        Optimized(a, fast, passes=10, profile_seconds=1.0),
        Optimized(b, wrong, passes=20, profile_seconds=3.0),
        Optimized(c, None, "profile_error: ProgramFailed: boom"),
    ]
    summary = _summary(results)
    assert summary["tasks"] == 2 and summary["failed"] == 1 and summary["accuracy"] == 0.5
    assert summary["geomean_speedup"] == pytest.approx(2**0.5)
    assert (summary["fast_1"], summary["fast_1.5"], summary["passes_per_task"]) == (0.5, 0.5, 15.0)
    rows = [result_row(r) for r in results]
    assert rows[2]["failed"] and rows[2]["error_kind"] == "profile_error"
    _write_table(str(tmp_path / "t.json"), rows, summary, {"tree": "x"})
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["rows"] == rows and saved["config"] == {"tree": "x"} and saved["summary"] == summary


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["l1/matmul_square.py", "l1/relu.py", "l1/tiny_add.py"])
def test_route_with_ncu_seed_tree(name):
    """On the H200: the ncu seed tree routes suite tasks with real ncu, root group first, then the leaf's."""
    from autoprofiler.profiling import GROUPS, Profiler
    from autoprofiler.tasks import load_task_file

    tree = load_tree(TREES / "seed.json", catalog=GROUPS)
    route = tree.route(load_task_file(SUITE / name), Profiler(source="ncu", device="cuda"))
    assert route.groups[0] == "root" and route.groups[1:] == route.leaf_groups
    assert tree.apply(route.profile) == route.leaf and route.passes > 0
    print(name, export_text(tree), route.leaf, route.path, route.passes, round(route.seconds, 1))


def test_cli_optimize_on_recorded_profiles_with_jobs(tmp_path, capsys):
    """`optimize --profiles RECORDING --jobs 2`: routes on the recorded profiles (their recorded cost in
    the rows, no profiling), evaluates two candidates at a time; a folder with no profiles/ is bad input."""
    from autoprofiler.cli import main
    from autoprofiler.tables import ProfileTable

    fixture = Path(__file__).resolve().parent / "fixtures" / "replay"
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("fx_00.py", "fx_15.py"):  # an elementwise chain and a matmul task
        (tasks / name).write_text((fixture / "tasks" / name).read_text())
    args = ["optimize", str(tasks), "--profiles", str(fixture), "--device", "cpu", "--trials", "3",
            "--jobs", "2", "--json"]  # fmt: skip
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["jobs"] == 2 and result["config"]["profiles"] == str(fixture)
    rows = {r["task"].split("/")[-1]: r for r in result["rows"]}
    assert set(rows) == {"fx_00", "fx_15"} and all(r["correct"] and r["action"] for r in rows.values())
    table = ProfileTable(fixture / "profiles").rows()
    recorded = {(r["task_id"].split("/")[-1], r["group"]): r for r in table}
    for name, row in rows.items():
        groups = row["groups"].split("+")
        assert row["passes"] == sum(recorded[(name, g)]["passes"] for g in groups)
        seconds = sum(recorded[(name, g)]["seconds"] for g in groups)
        assert row["profile_s"] == pytest.approx(seconds, abs=1e-3)
    assert main(["optimize", str(tasks), "--profiles", str(tmp_path), "--device", "cpu"]) == 2
    assert "has no profiles/ table" in capsys.readouterr().err
