"""What rule rewriters read in a profile: metric names (verbatim) and facts of the kernel table.

Metric names are the ncu names of ``autoprofiler/profiling/groups.py`` (the group that carries each is
in the comment) and the ``torch__*`` features of the torch source. The kernel table (``Profile.kernels``:
each kernel's name and duration, in launch order) comes with every shown group, as the "top kernels"
lines of a rendered profile do for an LLM, so facts read from names and durations alone (how many
kernels, how much of the time is in GEMM/conv library code, whether convolutions run in fp32) are known
whenever anything was profiled; what a group adds is its metrics.

Example::

    >>> rows = [{"name": "nchwToNhwcKernel", DURATION: 1.0}, {"name": "gemm", DURATION: 3.0}]
    >>> kernel_time_share(rows, LAYOUT_KERNELS), kernel_time_share(rows, GEMM_KERNELS)
    (0.25, 0.75)
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# ---- ncu metric names (verbatim); the groups that carry them ------------------------------------------
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"  # root, speed_of_light
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"  # root, speed_of_light, memory
DURATION = "gpu__time_duration.sum"  # ns, per kernel and summed over the task's kernels (root, sol)
KERNELS = "derived__kernel_count"  # root, speed_of_light
LAUNCH_SHARE = "derived__launch_overhead_share"  # speed_of_light
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"  # speed_of_light
L1_THROUGHPUT = "l1tex__throughput.avg.pct_of_peak_sustained_elapsed"  # speed_of_light, cache
L2_THROUGHPUT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"  # speed_of_light, cache
DRAM_READ = "dram__bytes_read.sum"  # memory, flops
DRAM_WRITE = "dram__bytes_write.sum"  # memory, flops
LOAD_BYTES_PER_SECTOR = "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio"  # memory
SMEM_LOAD_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"  # memory
L1_HIT = "l1tex__t_sector_hit_rate.pct"  # cache
L2_HIT = "lts__t_sector_hit_rate.pct"  # cache
SMEM_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"  # cache
WARP_LATENCY = "smsp__average_warp_latency_per_inst_issued.ratio"  # stalls
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"  # occupancy
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"  # occupancy
WAVES = "launch__waves_per_multiprocessor"  # occupancy
REGISTER_LIMIT = "launch__occupancy_limit_registers"  # occupancy
FMA_PIPE = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"  # compute_pipes
ISSUE_ACTIVE = "smsp__issue_active.avg.pct_of_peak_sustained_active"  # compute_pipes
XU_PIPE = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"  # compute_pipes
TENSOR_SHARE = "derived__tensor_core_time_share"  # tensor_cores
TENSOR_CYCLES = (  # tensor_cores
    "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active"
)
INSTRUCTIONS = "smsp__inst_executed.sum"  # instruction_mix
SHARED_LOADS = "smsp__sass_inst_executed_op_shared_ld.sum"  # instruction_mix
SHARED_STORES = "smsp__sass_inst_executed_op_shared_st.sum"  # instruction_mix
GLOBAL_LOADS = "smsp__sass_inst_executed_op_global_ld.sum"  # instruction_mix
GLOBAL_STORES = "smsp__sass_inst_executed_op_global_st.sum"  # instruction_mix
THREADS_PER_INSTRUCTION = "smsp__thread_inst_executed_per_inst_executed.ratio"  # instruction_mix
INTENSITY = "derived__arithmetic_intensity"  # flops
FLOPS = "derived__flop_count"  # flops
FFMA = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"  # flops
FADD = "sm__sass_thread_inst_executed_op_fadd_pred_on.sum"  # flops
FMUL = "sm__sass_thread_inst_executed_op_fmul_pred_on.sum"  # flops
HFMA = "sm__sass_thread_inst_executed_op_hfma_pred_on.sum"  # flops


def stall(reason: str) -> str:
    """The stalls group's ratio of one stall reason (``STALL_REASONS`` in ``profiling/groups.py``)."""
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


# ---- kernel-name families (cuBLAS, cuDNN, CUTLASS, PyTorch, Triton) ------------------------------------
# Kernels cuDNN launches to convert NCHW tensors for its NHWC (tensor-core) convolutions.
LAYOUT_KERNELS = r"nchwToNhwc|nhwcToNchw|nchw_to_nhwc|nhwc_to_nchw"
CONV_KERNELS = r"conv|fprop|dgrad|implicit_gemm|implicit_convolve|winograd"
GEMM_KERNELS = CONV_KERNELS + r"|gemm|gemv|gmma|nvjet|cutlass|xmma|cublas"  # cuBLAS/cuDNN/CUTLASS
# Half-precision element types in kernel names (cuDNN/cuBLAS/CUTLASS spellings and PyTorch's c10 types).
HALF_KERNELS = r"f16|fp16|bf16|half|bfloat16|h884|h1688|h16816|hgemm"
SOFTMAX_KERNELS = r"softmax"
REDUCTION_KERNELS = r"reduce|softmax|norm|cumsum|scan|argmax|max_pool|avg_pool|pool|sort|topk"

# ---- torch.profiler features and operator rows ----------------------------------------------------------
TORCH_DURATION = "torch__self_time_us"  # per-operator row duration of the torch source
CONV_OPS = r"conv"  # torch.profiler operator rows: aten::convolution, aten::mkldnn_convolution, ...
SOFTMAX_OPS = r"softmax"
MATMUL_OPS = r"(^|::)(matmul|bmm|mm|baddbmm|linear|addmm)$"


def number(value) -> float | None:
    """``value`` as a float when it is a finite real number (bool excluded), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def kernel_time_share(kernels: Iterable[dict], pattern: str, duration_key: str = DURATION) -> float:
    """Share of the summed ``duration_key`` in kernel rows whose ``name`` matches ``pattern`` (any case)."""
    regex = re.compile(pattern, re.IGNORECASE)
    total = matched = 0.0
    for row in kernels or ():
        value = number(row.get(duration_key))
        if value is None:
            continue
        total += value
        if regex.search(str(row.get("name", ""))):
            matched += value
    return matched / total if total > 0 else 0.0


def names_matching(kernels: Iterable[dict], pattern: str) -> list[str]:
    """The kernel names that match ``pattern`` (any case), in launch order."""
    regex = re.compile(pattern, re.IGNORECASE)
    return [str(row.get("name", "")) for row in kernels or () if regex.search(str(row.get("name", "")))]


def total_duration(kernels: Iterable[dict], duration_key: str = DURATION) -> float:
    """Summed ``duration_key`` of the kernel rows (ns for ncu, us for torch)."""
    return sum(number(row.get(duration_key)) or 0.0 for row in kernels or ())


def fp32_convolutions(kernels: Iterable[dict]) -> bool:
    """True when some convolution kernel carries no half-precision type in its name (an fp32 conv).

    cuDNN runs fp32 convolutions with TF32 allowed by default (``torch.backends.cudnn.allow_tf32``), and
    which algorithm (FFMA or one of several TF32 tilings) it picks depends on layout and flags: any
    rewrite that makes it pick another one changes the result by TF32 rounding (about 1e-3 relative),
    more than an fp32 tolerance of 1e-4 allows.

    >>> fp32_convolutions([{"name": "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw"}])
    True
    >>> fp32_convolutions([{"name": "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc"}])
    False
    """
    half = re.compile(HALF_KERNELS, re.IGNORECASE)
    return any(not half.search(name) for name in names_matching(kernels, CONV_KERNELS))


def half_convolutions(kernels: Iterable[dict]) -> bool:
    """True when there are convolution kernels and every one of them names a half-precision type."""
    convs = names_matching(kernels, CONV_KERNELS)
    half = re.compile(HALF_KERNELS, re.IGNORECASE)
    return bool(convs) and all(half.search(name) for name in convs)


def attention_sandwich(kernels: list[dict], duration_key: str = DURATION) -> float:
    """Share of time in the kernels from a softmax back to the GEMM before it, when a GEMM follows.

    The kernel sequence of explicit attention is GEMM (Q K^T), a few memory-bound passes over the score
    matrix (scale, mask, softmax), GEMM (P V). Returns the time share of those passes (0 when the
    sequence is absent).

    >>> rows = [{"name": "gemm", DURATION: 4.0}, {"name": "mul", DURATION: 1.0},
    ...         {"name": "softmax_warp_forward", DURATION: 3.0}, {"name": "gemm", DURATION: 2.0}]
    >>> attention_sandwich(rows)
    0.4
    """
    gemm = re.compile(GEMM_KERNELS, re.IGNORECASE)
    softmax = re.compile(SOFTMAX_KERNELS, re.IGNORECASE)
    names = [str(row.get("name", "")) for row in kernels]
    times = [number(row.get(duration_key)) or 0.0 for row in kernels]
    total = sum(times)
    if total <= 0:
        return 0.0
    best = 0.0
    for i, name in enumerate(names):
        if not softmax.search(name):
            continue
        before = [j for j in range(i) if gemm.search(names[j])]
        after = [j for j in range(i + 1, len(names)) if gemm.search(names[j])]
        if before and after:
            start, end = before[-1] + 1, after[0]
            best = max(best, sum(times[start:end]) / total)
    return best
