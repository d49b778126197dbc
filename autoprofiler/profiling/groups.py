"""Metric groups: named sets of Nsight Compute (gh100) metrics or torch.profiler features.

A *metric group* is what the profiling tree collects and shows: a leaf names groups, a REWRITE edit adds
groups. A *configuration* is a set of groups; the paper's four fixed configurations are below.

ncu groups (metric names verbatim, ``base.rollup[.subtype]`` form, checked against
``ncu --query-metrics --chip gh100`` by ``tests/test_profiling_groups.py``):

============== =================================================================================
root           SM throughput and DRAM throughput (% of peak) + kernel time: the tree's first split
speed_of_light SOL of SM, memory, DRAM, L1, L2 + duration, cycles, kernel count, launch overhead
memory         DRAM bytes, global load/store sectors per request, bytes per sector, smem conflicts
cache          L1 and L2 hit rates (read/write), L1/L2 throughput and traffic
stalls         warp latency per issued instruction + the 19 per-reason stall ratios (by name)
occupancy      achieved vs theoretical occupancy, limiters, registers, shared memory, block/grid, waves
compute_pipes  FMA/ALU/FP64/LSU/XU pipe utilization, IPC, issue active, eligible warps
tensor_cores   gmma instructions, hmma/hgmma/qgmma cycles, tensor FLOPs by precision, gmma stalls
instruction_mix instruction counts by kind, branches, divergence (threads per instruction)
flops          FP32/FP64/FP16 add/mul/fma thread instructions + DRAM bytes: the roofline inputs
============== =================================================================================

The hmma trap (see ``docs/metric_groups.md``): on Hopper ``sm__inst_executed_pipe_tensor_op_hmma`` and
``sm__pipe_tensor_op_hmma_cycles_active`` are non-zero for kernels that do no tensor-core work (HFMA2.MMA
runs on that pipe), so ``tensor_cores`` uses gmma instruction counts, the combined
``hmma_type_hmma_hgmma_qgmma`` cycles and per-precision ``ops_path`` counts instead.

Fixed configurations (the paper publishes no metric lists; our mapping, reasons in the docs page):
``algorithm`` = speed_of_light + flops + instruction_mix (how much work, of what kind, where on the
roofline); ``memory`` = speed_of_light + memory + cache; ``latency`` = speed_of_light + stalls +
occupancy; ``compute`` = speed_of_light + compute_pipes + tensor_cores. The torch analogues
(``torch_algorithm``, ...) use the torch.profiler groups.

Some names in a group are not counters: ``derived__*`` features are computed by
:mod:`autoprofiler.profiling.profile` from the group's own metrics, and ``launch__*`` plus
``sm__maximum_warps_per_active_cycle_pct`` (theoretical occupancy) come along in every raw ncu report
for free. Neither is passed to ``--metrics``.

``passes`` (replay passes on the H200) is measured by ``bench/profile_cost.py`` and read from
``group_costs.json`` beside this file when present; ``None`` until measured.

Example:
    >>> from autoprofiler.profiling.groups import GROUPS, CONFIGURATIONS, ncu_request_metrics
    >>> GROUPS["root"].metrics[:2]
    ('sm__throughput.avg.pct_of_peak_sustained_elapsed', 'dram__throughput.avg.pct_of_peak_sustained_elapsed')
    >>> CONFIGURATIONS["memory"]
    ('speed_of_light', 'memory', 'cache')
    >>> ncu_request_metrics(["root"])[2:]
    ['gpu__time_duration.sum']
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

ROOT_GROUP = "root"
TORCH_ROOT_GROUP = "torch_root"
DURATION_METRIC = "gpu__time_duration.sum"  # always collected: the weight of every aggregation
COSTS_PATH = Path(__file__).with_name("group_costs.json")
RANGE_PATH = Path(__file__).with_name("range_unsupported.json")


def _range_unsupported() -> frozenset[str]:
    """Metrics ncu refuses under ``--replay-mode range`` ("Metric ... is not supported in range
    replay"), kept in ``range_unsupported.json`` (``tests/test_profiling_gpu.py``'s per-group range
    tests write what they learn to ``$AUTOPROFILER_BENCH_OUT/range_unsupported.json``). A metric not
    listed yet is learned at run time: the profiler drops what ncu names and runs again."""
    try:
        data = json.loads(RANGE_PATH.read_text())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(m for m in data.get("unsupported", []) if isinstance(m, str))


RANGE_UNSUPPORTED = _range_unsupported()

# Columns that every raw ncu report carries whatever --metrics says (launch statistics, theoretical
# occupancy): never requested, validated against a captured header instead of the metric catalog.
FREE_COLUMN_PREFIXES = ("launch__",)
FREE_COLUMNS = frozenset({"sm__maximum_warps_per_active_cycle_pct"})

# ncu rollups and subtypes: the base name of a metric is what comes before the first of these.
ROLLUPS = ("sum", "avg", "max", "min")
SUBTYPES = (
    "pct_of_peak_sustained_elapsed",
    "pct_of_peak_sustained_active",
    "pct_of_peak_sustained_region",
    "pct_of_peak_sustained_frame",
    "peak_sustained",
    "peak_sustained_active",
    "peak_sustained_elapsed",
    "per_second",
    "per_cycle_active",
    "per_cycle_elapsed",
    "per_cycle_in_region",
    "per_cycle_in_frame",
    "pct",
    "ratio",
    "max_rate",
)

STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "gmma",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)

FLOP_METRICS = tuple(
    f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
    for p in ("f", "d", "h")
    for op in ("add", "mul", "fma")
)
TENSOR_OPS_METRICS = (
    "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_op_hgmma_src_fp16.sum",
    "sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum",
    "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_op_hmma_src_fp16.sum",
    "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum",
)


@dataclass(frozen=True)
class MetricGroup:
    """A named set of metrics collected (and shown) together.

    Attributes:
        name: ``"speed_of_light"``, ``"memory"``, ...; torch groups start with ``"torch_"``.
        source: ``"ncu"`` or ``"torch"``.
        metrics: ncu metric names verbatim (``base.rollup[.subtype]``), ``launch__*`` columns and
            ``derived__*`` features; or torch feature names ``torch__*``.
        description: one line, shown in docs and the CLI.
        passes: replay passes measured on the H200 (ncu), ``None`` until measured and for torch.
    """

    name: str
    source: str
    metrics: tuple[str, ...]
    description: str
    passes: int | None = None


def _ncu(name: str, description: str, *metrics: str) -> MetricGroup:
    return MetricGroup(name=name, source="ncu", metrics=tuple(metrics), description=description)


def _torch(name: str, description: str, *features: str) -> MetricGroup:
    return MetricGroup(name=name, source="torch", metrics=tuple(features), description=description)


_NCU_GROUPS = (
    _ncu(
        "root",
        "SM and DRAM throughput (% of peak) and kernel time: the routing root",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        DURATION_METRIC,
        "derived__kernel_count",
    ),
    _ncu(
        "speed_of_light",
        "speed of light: SM, memory, DRAM, L1, L2 throughput, duration, cycles, launch overhead",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        DURATION_METRIC,
        "sm__cycles_elapsed.avg",
        "derived__kernel_count",
        "derived__launch_overhead_share",
    ),
    _ncu(
        "memory",
        "DRAM traffic, global access efficiency (sectors per request), shared-memory bank conflicts",
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
        "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio",
        "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.ratio",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "derived__global_load_sectors_per_request",
        "derived__global_store_sectors_per_request",
    ),
    _ncu(
        "cache",
        "L1 and L2 hit rates, L1/L2 throughput and L2 traffic from L1",
        "l1tex__t_sector_hit_rate.pct",
        "lts__t_sector_hit_rate.pct",
        "lts__t_sector_op_read_hit_rate.pct",
        "lts__t_sector_op_write_hit_rate.pct",
        "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__t_sectors_srcunit_tex_op_read.sum",
        "lts__t_sectors_srcunit_tex_op_write.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    ),
    _ncu(
        "stalls",
        "warp latency per issued instruction and the per-reason stall breakdown",
        "smsp__average_warp_latency_per_inst_issued.ratio",
        *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS),
    ),
    _ncu(
        "occupancy",
        "achieved and theoretical occupancy, limiters, registers, shared memory, block/grid, waves",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem",
        "launch__occupancy_limit_warps",
        "launch__occupancy_limit_blocks",
        "launch__registers_per_thread",
        "launch__shared_mem_per_block_static",
        "launch__shared_mem_per_block_dynamic",
        "launch__block_size",
        "launch__grid_size",
        "launch__waves_per_multiprocessor",
    ),
    _ncu(
        "compute_pipes",
        "FMA/ALU/FP64/LSU/XU pipe utilization, IPC, issue slots, eligible warps",
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
        "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed.avg.per_cycle_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "smsp__warps_eligible.avg.per_cycle_active",
    ),
    _ncu(
        "tensor_cores",
        "tensor cores: gmma instructions, hmma/hgmma/qgmma cycles, tensor FLOPs by precision",
        "sm__inst_executed_pipe_tensor_op_gmma.sum",
        "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
        *TENSOR_OPS_METRICS,
        "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio",
        "derived__tensor_flop_count",
        "derived__tensor_core_time_share",
    ),
    _ncu(
        "instruction_mix",
        "instruction counts by kind (global/shared loads and stores, branches) and divergence",
        "smsp__inst_executed.sum",
        "smsp__sass_inst_executed_op_global_ld.sum",
        "smsp__sass_inst_executed_op_global_st.sum",
        "smsp__sass_inst_executed_op_shared_ld.sum",
        "smsp__sass_inst_executed_op_shared_st.sum",
        "smsp__inst_executed_op_branch.sum",
        "smsp__sass_branch_targets_threads_divergent.sum",
        "smsp__thread_inst_executed_per_inst_executed.ratio",
        "smsp__thread_inst_executed_pred_on_per_inst_executed.ratio",
    ),
    _ncu(
        "flops",
        "FP32/FP64/FP16 add/mul/fma thread instructions and DRAM bytes: FLOPs, FLOP/s, intensity",
        *FLOP_METRICS,
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "derived__flop_count",
        "derived__achieved_flops_per_s",
        "derived__arithmetic_intensity",
    ),
)

_TORCH_GROUPS = (
    _torch(
        "torch_root",
        "share of operator time in matmul/conv vs elementwise ops, and wall time of one call",
        "torch__matmul_time_share",
        "torch__elementwise_time_share",
        "torch__wall_time_us",
    ),
    _torch(
        "torch_ops",
        "operator self-time shares by category, top operator share, operator and kernel counts",
        "torch__matmul_time_share",
        "torch__elementwise_time_share",
        "torch__reduction_time_share",
        "torch__copy_time_share",
        "torch__other_time_share",
        "torch__top_op_time_share",
        "torch__op_count",
        "torch__kernel_count",
    ),
    _torch(
        "torch_memory",
        "memory allocated by operators, input/output/parameter bytes, copy time share",
        "torch__memory_allocated_bytes",
        "torch__io_bytes",
        "torch__param_bytes",
        "torch__copy_time_share",
    ),
    _torch(
        "torch_flops",
        "FLOP estimate (with_flops), achieved FLOP/s, FLOPs per byte of inputs/outputs/params",
        "torch__flop_count",
        "torch__achieved_flops_per_s",
        "torch__arithmetic_intensity",
    ),
    _torch(
        "torch_launch",
        "wall time vs operator time: launch/dispatch overhead share, mean operator time, counts",
        "torch__wall_time_us",
        "torch__op_time_us",
        "torch__launch_overhead_share",
        "torch__mean_op_time_us",
        "torch__op_count",
        "torch__kernel_count",
    ),
)


def _load_costs(path: Path = COSTS_PATH) -> dict[str, int]:
    """Passes per group from ``group_costs.json`` (written by ``bench/profile_cost.py``), or ``{}``."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return {str(k): int(v) for k, v in data.get("passes", {}).items() if v is not None}
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return {}


def _build_groups() -> dict[str, MetricGroup]:
    costs = _load_costs()
    groups = {}
    for group in _NCU_GROUPS + _TORCH_GROUPS:
        passes = costs.get(group.name) if group.source == "ncu" else None
        groups[group.name] = replace(group, passes=passes)
    return groups


GROUPS: dict[str, MetricGroup] = _build_groups()

CONFIGURATIONS: dict[str, tuple[str, ...]] = {
    "algorithm": ("speed_of_light", "flops", "instruction_mix"),
    "memory": ("speed_of_light", "memory", "cache"),
    "latency": ("speed_of_light", "stalls", "occupancy"),
    "compute": ("speed_of_light", "compute_pipes", "tensor_cores"),
    "torch_algorithm": ("torch_root", "torch_ops", "torch_flops"),
    "torch_memory": ("torch_root", "torch_memory"),
    "torch_latency": ("torch_root", "torch_launch"),
    "torch_compute": ("torch_root", "torch_flops"),
}


def base_name(metric: str) -> str:
    """The ncu base name: what comes before the first rollup or subtype suffix.

    >>> base_name("sm__throughput.avg.pct_of_peak_sustained_elapsed")
    'sm__throughput'
    >>> base_name("l1tex__t_sector_hit_rate.pct")
    'l1tex__t_sector_hit_rate'
    """
    parts = metric.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part in ROLLUPS or part in SUBTYPES:
            return ".".join(parts[:i])
    return metric


def is_free_column(metric: str) -> bool:
    """True for columns every raw ncu report carries without asking (launch stats, theoretical occupancy)."""
    return metric.startswith(FREE_COLUMN_PREFIXES) or metric in FREE_COLUMNS


def is_counter_metric(metric: str) -> bool:
    """True for names that must be passed to ``ncu --metrics`` (not derived, not free columns)."""
    return not metric.startswith("derived__") and not is_free_column(metric)


def resolve_groups(names: Iterable[str] | str, source: str | None = None) -> tuple[str, ...]:
    """Validate group names (a list, or one comma-separated string), in order, without duplicates.

    Configuration names are not expanded here (``"memory"`` is both a group and a configuration): pass
    ``CONFIGURATIONS[name]`` for a configuration.

    Raises:
        KeyError: an unknown group, or a group of another source than ``source``.

    >>> resolve_groups("root,memory")
    ('root', 'memory')
    """
    if isinstance(names, str):
        names = names.split(",")
    out: list[str] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name not in GROUPS:
            raise KeyError(f"unknown metric group {name!r}: expected one of {sorted(GROUPS)}")
        if source is not None and GROUPS[name].source != source:
            raise KeyError(f"group {name!r} has source {GROUPS[name].source!r}, expected {source!r}")
        if name not in out:
            out.append(name)
    return tuple(out)


def group_metrics(groups: Iterable[str]) -> list[str]:
    """All names of the given groups, in group then catalog order, without duplicates."""
    seen: dict[str, None] = {}
    for group in groups:
        for metric in GROUPS[group].metrics:
            seen.setdefault(metric, None)
    return list(seen)


def ncu_request_metrics(groups: Iterable[str], replay: str = "kernel") -> list[str]:
    """The ``--metrics`` list for these ncu groups: counters only, plus the kernel duration.

    ``replay="range"``: less the metrics ncu cannot collect over a range (``RANGE_UNSUPPORTED``)."""
    metrics = [m for m in group_metrics(groups) if is_counter_metric(m)]
    if replay == "range":
        metrics = [m for m in metrics if m not in RANGE_UNSUPPORTED]
    if DURATION_METRIC not in metrics:
        metrics.append(DURATION_METRIC)
    return metrics
