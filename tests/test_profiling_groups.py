"""Metric groups: every ncu name is real on gh100, configurations are well formed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autoprofiler.profiling import groups as groups_mod
from autoprofiler.profiling.groups import (
    CONFIGURATIONS,
    DURATION_METRIC,
    GROUPS,
    ROOT_GROUP,
    TORCH_ROOT_GROUP,
    base_name,
    is_counter_metric,
    is_free_column,
    ncu_request_metrics,
    resolve_groups,
)

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
BASES = set((FIXTURES / "metric_bases_gh100.txt").read_text().split())
# Columns every raw report carries (launch statistics, theoretical occupancy): from a real capture.
FREE_HEADER = set(
    next(csv.reader([(FIXTURES / "tiny_kernel_full_set_baseunits.csv").read_text().splitlines()[0]]))
)

NCU_METRICS = sorted({m for g in GROUPS.values() if g.source == "ncu" for m in g.metrics})


@pytest.mark.parametrize("metric", NCU_METRICS)
def test_every_ncu_metric_exists_on_gh100(metric):
    """Each ncu name is a gh100 base metric with a rollup, a free report column, or a derived feature."""
    if metric.startswith("derived__"):
        from autoprofiler.profiling.profile import DERIVED_UNITS

        assert metric in DERIVED_UNITS, f"{metric} is listed but never computed"
    elif is_free_column(metric):
        assert metric in FREE_HEADER, f"{metric} is not a column of a raw ncu report"
    else:
        assert base_name(metric) != metric, f"{metric} has no rollup suffix (.sum/.avg/.pct/.ratio...)"
        assert base_name(metric) in BASES, f"{base_name(metric)} is not in metric_bases_gh100.txt"


def test_base_name_follows_ncu_suffix_rules():
    """The base is what precedes the first rollup or subtype."""
    assert base_name("sm__throughput.avg.pct_of_peak_sustained_elapsed") == "sm__throughput"
    assert base_name("dram__bytes_read.sum.per_second") == "dram__bytes_read"
    assert (
        base_name("smsp__average_warp_latency_per_inst_issued.ratio")
        == "smsp__average_warp_latency_per_inst_issued"
    )
    assert base_name("lts__t_sector_hit_rate.pct") == "lts__t_sector_hit_rate"
    assert base_name("launch__grid_size") == "launch__grid_size"


def test_catalog_shape():
    """About ten ncu groups plus torch groups; names and sources consistent; no duplicates in a group."""
    ncu_groups = [g for g in GROUPS.values() if g.source == "ncu"]
    torch_groups = [g for g in GROUPS.values() if g.source == "torch"]
    assert 8 <= len(ncu_groups) <= 12
    assert ROOT_GROUP in GROUPS and TORCH_ROOT_GROUP in GROUPS
    assert all(g.name.startswith("torch_") for g in torch_groups)
    assert all(m.startswith("torch__") for g in torch_groups for m in g.metrics)
    assert not any(m.startswith("torch__") for g in ncu_groups for m in g.metrics)
    for group in GROUPS.values():
        assert len(set(group.metrics)) == len(group.metrics), group.name
        assert group.passes is None or group.passes > 0
        if group.source == "torch":
            assert group.passes is None


def test_root_is_sm_and_dram_throughput():
    """The root group is the paper's two-metric root (+ kernel time)."""
    assert GROUPS[ROOT_GROUP].metrics[:3] == (
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        DURATION_METRIC,
    )


def test_stalls_are_named_one_by_one():
    """The stall group lists each per-reason ratio explicitly (no regex), all 19 of them."""
    stalls = GROUPS["stalls"].metrics
    assert not any("regex" in m for m in stalls)
    reasons = [m for m in stalls if m.startswith("smsp__average_warps_issue_stalled_")]
    assert len(reasons) == 19


def test_tensor_cores_avoid_the_hmma_trap():
    """No hmma-pipe-only metric (non-zero without tensor work on Hopper) in the tensor group."""
    tensor = GROUPS["tensor_cores"].metrics
    assert "sm__inst_executed_pipe_tensor_op_gmma.sum" in tensor
    assert not any(
        base_name(m) in ("sm__inst_executed_pipe_tensor_op_hmma", "sm__pipe_tensor_op_hmma_cycles_active")
        for m in tensor
    )


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_configurations_name_groups_of_one_source(name):
    """Every configuration is a tuple of known groups of a single source; ncu ones have no torch_ prefix."""
    groups = CONFIGURATIONS[name]
    assert groups and all(g in GROUPS for g in groups)
    sources = {GROUPS[g].source for g in groups}
    assert sources == ({"torch"} if name.startswith("torch_") else {"ncu"})


def test_four_fixed_configurations_for_each_source():
    """Algorithm, memory, latency, compute exist for ncu and torch."""
    for name in ("algorithm", "memory", "latency", "compute"):
        assert name in CONFIGURATIONS and f"torch_{name}" in CONFIGURATIONS


def test_request_metrics_exclude_derived_and_free_columns():
    """--metrics carries counters only, always with the kernel duration, no duplicates."""
    metrics = ncu_request_metrics(["occupancy", "flops", "root"])
    assert DURATION_METRIC in metrics
    assert len(metrics) == len(set(metrics))
    assert all(is_counter_metric(m) for m in metrics)
    assert "launch__grid_size" not in metrics and "derived__flop_count" not in metrics
    assert "sm__warps_active.avg.pct_of_peak_sustained_active" in metrics


def test_resolve_groups_validates():
    """Known names pass in order without duplicates; unknown or wrong-source names fail with the list."""
    assert resolve_groups("root, memory,root") == ("root", "memory")
    with pytest.raises(KeyError, match="unknown metric group 'nope'"):
        resolve_groups(["nope"])
    with pytest.raises(KeyError, match="expected 'ncu'"):
        resolve_groups(["torch_ops"], source="ncu")


def test_group_costs_json_sets_passes(tmp_path, monkeypatch):
    """group_costs.json (written by bench/profile_cost.py) fills MetricGroup.passes for ncu groups."""
    path = tmp_path / "group_costs.json"
    path.write_text(json.dumps({"passes": {"root": 9, "stalls": 3, "torch_ops": 5}}))
    monkeypatch.setattr(groups_mod, "COSTS_PATH", path)
    assert groups_mod._load_costs(path) == {"root": 9, "stalls": 3, "torch_ops": 5}
    monkeypatch.setattr(groups_mod, "_load_costs", lambda p=path: {"root": 9, "torch_ops": 5})
    built = groups_mod._build_groups()
    assert built["root"].passes == 9 and built["torch_ops"].passes is None and built["memory"].passes is None
