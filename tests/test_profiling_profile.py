"""Profile: aggregation on a hand-made two-kernel table, derived features, restrict/merge, exact render."""

from __future__ import annotations

import pytest

from autoprofiler.profiling.groups import FLOP_METRICS
from autoprofiler.profiling.profile import (
    Profile,
    aggregate,
    derive,
    format_value,
    is_summed,
    profile_from_kernels,
    render_profile,
)

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
T = "gpu__time_duration.sum"


def two_kernels() -> list[dict]:
    """A 3 us GEMM-like kernel and a 1 us elementwise kernel; values chosen to be checked by hand."""
    zero_flops = dict.fromkeys(FLOP_METRICS, 0.0)
    return [
        {
            **zero_flops,
            "name": "gemm_kernel",
            "id": 0,
            T: 3000.0,
            SM: 80.0,
            DRAM: 20.0,
            "dram__bytes_read.sum": 1000.0,
            "dram__bytes_write.sum": 500.0,
            "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": 100.0,
            "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 50.0,
            "sm__inst_executed_pipe_tensor_op_gmma.sum": 10.0,
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 400.0,
            "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 100.0,
            "launch__registers_per_thread": 128.0,
        },
        {
            **zero_flops,
            "name": "relu_kernel",
            "id": 1,
            T: 1000.0,
            SM: 20.0,
            DRAM: 60.0,
            "dram__bytes_read.sum": 3000.0,
            "dram__bytes_write.sum": 500.0,
            "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 10.0,
            "sm__inst_executed_pipe_tensor_op_gmma.sum": 0.0,
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 800.0,
            "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 100.0,
            "launch__registers_per_thread": 16.0,
        },
    ]


def test_aggregate_sums_counts_and_weights_rates_by_duration():
    """.sum -> sum; pct/ratio/launch columns -> duration-weighted mean (worked out by hand)."""
    metrics = aggregate(
        two_kernels(), [T, SM, DRAM, "dram__bytes_read.sum", "launch__registers_per_thread", "missing.sum"]
    )
    assert metrics == {
        T: 4000.0,
        SM: 65.0,  # (80*3000 + 20*1000) / 4000
        DRAM: 30.0,  # (20*3000 + 60*1000) / 4000
        "dram__bytes_read.sum": 4000.0,
        "launch__registers_per_thread": 100.0,  # (128*3000 + 16*1000) / 4000
    }


def test_aggregate_skips_missing_and_falls_back_to_plain_mean():
    """Kernels without a value do not dilute the mean; zero total duration gives the plain mean."""
    kernels = [{T: 100.0, SM: 10.0}, {T: 300.0, SM: None}, {T: 0.0, "x.ratio": 1.0}, {T: 0.0, "x.ratio": 3.0}]
    assert aggregate(kernels, [SM, "x.ratio"]) == {SM: 10.0, "x.ratio": 2.0}


def test_is_summed_by_suffix():
    """Only a trailing .sum rollup is summed."""
    assert is_summed("dram__bytes_read.sum") and is_summed(T)
    assert not is_summed("sm__throughput.sum.pct_of_peak_sustained_elapsed")
    assert not is_summed("dram__bytes.sum.per_second")
    assert not is_summed("l1tex__t_sector_hit_rate.pct") and not is_summed("launch__grid_size")


def test_derived_features_by_hand():
    """FLOPs, FLOP/s, intensity, tensor-core share, sectors/request, launch overhead, kernel count."""
    kernels = two_kernels()
    names = [T, "dram__bytes_read.sum", "dram__bytes_write.sum", *FLOP_METRICS,
             "sm__inst_executed_pipe_tensor_op_gmma.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
             "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]  # fmt: skip
    derived = derive(aggregate(kernels, names), kernels, wall_us=10.0)
    assert derived == {
        "derived__kernel_count": 2.0,
        "derived__launch_overhead_share": pytest.approx(0.6),  # 1 - 4 us / 10 us
        "derived__flop_count": 260.0,  # fadd 60 + 2 * ffma 100
        "derived__achieved_flops_per_s": pytest.approx(6.5e7),  # 260 / 4e-6 s
        "derived__arithmetic_intensity": pytest.approx(0.052),  # 260 / 5000 bytes
        "derived__tensor_core_time_share": 0.75,  # only the gmma kernel: 3000 / 4000
        "derived__global_load_sectors_per_request": 6.0,  # 1200 / 200
    }


def test_launch_overhead_is_clipped():
    """Kernel time above the wall time (clock noise) clips to 0, never negative."""
    assert derive({}, [{T: 5000.0}], wall_us=4.0)["derived__launch_overhead_share"] == 0.0


def test_profile_holds_only_requested_groups():
    """Collected metrics outside the groups are dropped; derived ones are kept only if a group lists them."""
    profile = profile_from_kernels(
        "h", two_kernels(), ["root"], {T: "ns", SM: "%"}, wall_us=10.0, passes=9, seconds=2.0, device="d"
    )
    assert set(profile.metrics) == {SM, DRAM, T, "derived__kernel_count"}
    assert profile.kernels[1] == {"name": "relu_kernel", "id": 1, T: 1000.0, SM: 20.0, DRAM: 60.0}
    assert profile.units == {T: "ns", SM: "%", "derived__kernel_count": "kernel"}


def test_restrict_and_merge():
    """restrict keeps a group's names (metrics and kernel columns); merge unions, self wins, costs add."""
    kernels = two_kernels()
    root = profile_from_kernels("h", kernels, ["root"], {}, wall_us=10.0, passes=9, seconds=2.0, device="d")
    memory = profile_from_kernels(
        "h", kernels, ["memory"], {}, wall_us=10.0, passes=7, seconds=3.0, device="d"
    )
    both = root.merge(memory)
    assert both.groups == {"root", "memory"} and both.passes == 16 and both.seconds == 5.0
    assert both.metrics["dram__bytes_read.sum"] == 4000.0 and both.metrics[SM] == 65.0
    assert both.kernels[0]["dram__bytes_read.sum"] == 1000.0 and both.kernels[0][SM] == 80.0
    only_memory = both.restrict(["memory", "stalls"])
    assert only_memory.groups == {"memory"}
    assert SM not in only_memory.metrics and DRAM in only_memory.metrics  # dram throughput is in both groups
    assert SM not in only_memory.kernels[0] and only_memory.kernels[0][T] == 3000.0
    assert Profile.from_dict(both.to_dict()) == both
    with pytest.raises(ValueError, match="same task and source"):
        both.merge(Profile("other", "ncu", frozenset(), {}))


def test_merge_with_different_kernel_lists_keeps_first_table():
    """Runs that saw different kernels: task metrics still merge, the kernel table is the first run's."""
    a = Profile("h", "ncu", frozenset({"root"}), {SM: 1.0}, kernels=[{"name": "k1"}])
    b = Profile(
        "h",
        "ncu",
        frozenset({"memory"}),
        {"dram__bytes_read.sum": 2.0},
        kernels=[{"name": "k2"}, {"name": "k3"}],
    )
    merged = a.merge(b)
    assert merged.kernels == [{"name": "k1"}] and merged.metrics == {SM: 1.0, "dram__bytes_read.sum": 2.0}


def test_format_value():
    """Compact deterministic numbers."""
    assert [format_value(v) for v in (4000.0, 65.0, 0.052, 6.5e7, 1.37e11, float("nan"))] == [
        "4,000", "65", "0.05", "65,000,000", "1.37e+11", "n/a",
    ]  # fmt: skip


EXPECTED_RENDER = """\
profile (ncu, NVIDIA H200): 2 kernels, 4 us total
[root]
  sm__throughput.avg.pct_of_peak_sustained_elapsed = 65 %
  dram__throughput.avg.pct_of_peak_sustained_elapsed = 30 %
  gpu__time_duration.sum = 4,000 ns
  derived__kernel_count = 2 kernel
[flops]
  sm__sass_thread_inst_executed_op_fadd_pred_on.sum = 60 inst
  sm__sass_thread_inst_executed_op_fmul_pred_on.sum = 0 inst
  sm__sass_thread_inst_executed_op_ffma_pred_on.sum = 100 inst
  sm__sass_thread_inst_executed_op_dadd_pred_on.sum = 0 inst
  sm__sass_thread_inst_executed_op_dmul_pred_on.sum = 0 inst
  sm__sass_thread_inst_executed_op_dfma_pred_on.sum = 0 inst
  sm__sass_thread_inst_executed_op_hadd_pred_on.sum = 0 inst
  sm__sass_thread_inst_executed_op_hmul_pred_on.sum = 0 inst
  sm__sass_thread_inst_executed_op_hfma_pred_on.sum = 0 inst
  dram__bytes_read.sum = 4,000 byte
  dram__bytes_write.sum = 1,000 byte
  derived__flop_count = 260 FLOP
  derived__achieved_flops_per_s = 65,000,000 FLOP/s
  derived__arithmetic_intensity = 0.05 FLOP/byte
top kernels by time:
  1.  75.0%          3 us  gemm_kernel
"""


def test_render_profile_exact():
    """Selected groups only, catalog order, units, n/a-free here, top kernel by time."""
    units = {T: "ns", SM: "%", DRAM: "%", "dram__bytes_read.sum": "byte", "dram__bytes_write.sum": "byte"}
    units.update(dict.fromkeys(FLOP_METRICS, "inst"))
    profile = profile_from_kernels(
        "abc",
        two_kernels(),
        ["flops", "root", "memory"],
        units,
        wall_us=10.0,
        passes=12,
        seconds=3.0,
        device="NVIDIA H200",
    )
    text = render_profile(profile, ["flops", "root", "tensor_cores"], top_kernels=1)
    assert text == EXPECTED_RENDER
    assert render_profile(profile, ["flops", "root"], top_kernels=1) == text  # deterministic
    assert "[memory]" in render_profile(profile)  # default: every collected group
    assert "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum = n/a" in render_profile(profile, ["memory"])


def test_render_torch_profile_lists_operators():
    """Torch profiles render their operators (times in us) under the same layout."""
    profile = Profile(
        "h", "torch", frozenset({"torch_root"}),
        {"torch__matmul_time_share": 0.75, "torch__elementwise_time_share": 0.25,
         "torch__wall_time_us": 120.0},
        kernels=[{"name": "aten::addmm", "torch__self_time_us": 60.0},
                 {"name": "aten::relu", "torch__self_time_us": 20.0}],
        device="cpu", units={"torch__wall_time_us": "us"},
    )  # fmt: skip
    assert render_profile(profile, top_kernels=2) == (
        "profile (torch, cpu): 2 operators, 80 us total\n"
        "[torch_root]\n"
        "  torch__matmul_time_share = 0.75\n"
        "  torch__elementwise_time_share = 0.25\n"
        "  torch__wall_time_us = 120 us\n"
        "top operators by time:\n"
        "  1.  75.0%         60 us  aten::addmm\n"
        "  2.  25.0%         20 us  aten::relu\n"
    )
