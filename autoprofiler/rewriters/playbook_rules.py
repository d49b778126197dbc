"""The playbook's decision list: what a performance engineer concludes from each group's metrics.

Each ``PlaybookRule`` names the metrics it reads (verbatim, ``needs``); it is considered only when all of
them are in the shown profile, so what the rewriter concludes depends on which groups were profiled.
Facts of the kernel table (how many kernels, their durations, how much time is in GEMM/conv library
code, whether convolutions run in fp32: ``evidence.py``) come with every shown group and only qualify a
rule. The rewriter (``playbook.py``) walks ``NCU_RULES`` or ``TORCH_RULES`` in order and takes the first
rule that fires and whose action the guard allows (``playbook_facts.vetoed``); the table of rules, their
physical arguments and the freeze are in ``playbook.py``'s docstring.

Thresholds are H200 facts or round numbers from the argument (a kernel under one wave cannot fill the
GPU; half the time stalled on one reason is that reason's regime), checked only against the tuning split
of ``datasets/h200_suite`` (``split.py``); see the freeze note in ``playbook.py``.
"""

from __future__ import annotations

from autoprofiler.rewriters.evidence import (
    ACHIEVED_OCCUPANCY,
    DRAM,
    DRAM_READ,
    FADD,
    FFMA,
    FMA_PIPE,
    FMUL,
    INSTRUCTIONS,
    INTENSITY,
    L2_HIT,
    L2_THROUGHPUT,
    LAUNCH_SHARE,
    LOAD_BYTES_PER_SECTOR,
    MEMORY_THROUGHPUT,
    SHARED_LOADS,
    SHARED_STORES,
    SM,
    TENSOR_SHARE,
    THEORETICAL_OCCUPANCY,
    WARP_LATENCY,
    WAVES,
    stall,
)
from autoprofiler.rewriters.playbook_facts import (
    SHORT_KERNEL_US,
    PlaybookRule,
    sandwich_dram,
    stall_share,
)

NCU_RULES: tuple[PlaybookRule, ...] = (
    # ---- reduced precision: only where the tolerance allows it (never at the fp32 default 1e-4) ----
    PlaybookRule(
        "fp32_gemm_off_tensor_cores",
        "tf32",
        "ncu",
        (TENSOR_SHARE,),
        lambda f: f.tolerances.tf32 and f.m(TENSOR_SHARE) < 0.05 and f.v("library") >= 0.5,
        "GEMM/conv kernels take {library:.0%} of the time with tensor cores idle "
        "({derived__tensor_core_time_share:.2f}): fp32 math on CUDA cores; TF32 puts it on tensor cores "
        "and the tolerance allows it",
    ),
    PlaybookRule(
        "fp32_gemm_fma_bound",
        "tf32",
        "ncu",
        (FMA_PIPE,),
        lambda f: f.tolerances.tf32 and f.m(FMA_PIPE) >= 50 and f.v("library") >= 0.5,
        "GEMM/conv kernels ({library:.0%} of the time) keep the FMA pipe "
        "{sm__pipe_fma_cycles_active_avg_pct_of_peak_sustained_active:.0f}% busy: a CUDA-core fp32 GEMM; "
        "TF32 tensor cores have several times its peak and the tolerance allows them",
    ),
    PlaybookRule(
        "fp32_compute_bound_math",
        "tf32",
        "ncu",
        (INTENSITY, FFMA, FADD, FMUL),
        lambda f: (
            f.tolerances.tf32
            and f.m(INTENSITY) >= 50
            and f.v("fp32_flop_share") >= 0.5
            and f.v("library") >= 0.5
        ),
        "{derived__arithmetic_intensity:.0f} FLOP/B, {fp32_flop_share:.0%} of it fp32 FMA/add/mul in "
        "GEMM/conv code: compute-bound fp32; TF32 only switches the math mode (no casts), which is all a "
        "compute-bound GEMM needs, and the tolerance allows it",
    ),
    PlaybookRule(
        "fp32_ridge_gemm_loose",
        "autocast_bf16",
        "ncu",
        (INTENSITY, FFMA, FADD, FMUL),
        lambda f: (
            f.tolerances.bf16
            and 10 <= f.m(INTENSITY) < 50
            and f.v("fp32_flop_share") >= 0.5
            and f.v("library") >= 0.5
        ),
        "fp32 GEMM/conv at {derived__arithmetic_intensity:.0f} FLOP/B: near the ridge point, so operand "
        "bytes matter too; bf16 autocast halves them and uses tensor cores, with fp32's exponent range "
        "(the loose tolerance allows bf16's 8-bit mantissa)",
    ),
    PlaybookRule(
        "fp32_ridge_gemm",
        "autocast_fp16",
        "ncu",
        (INTENSITY, FFMA, FADD, FMUL),
        lambda f: (
            f.tolerances.fp16
            and 10 <= f.m(INTENSITY) < 50
            and f.v("fp32_flop_share") >= 0.5
            and f.v("library") >= 0.5
        ),
        "fp32 GEMM/conv at {derived__arithmetic_intensity:.0f} FLOP/B: near the ridge point, so operand "
        "bytes matter too; fp16 autocast halves them and uses tensor cores (TF32's 10-bit mantissa, "
        "which the tolerance allows)",
    ),
    # ---- launch- and latency-bound ----
    PlaybookRule(
        "launch_bound_pointwise_chain",
        "compile_cudagraphs",
        "ncu",
        (LAUNCH_SHARE, INSTRUCTIONS, SHARED_LOADS, SHARED_STORES),
        lambda f: f.m(LAUNCH_SHARE) >= 0.5 and f.v("count") >= 3 and f.v("shared_share") < 0.01,
        "{derived__launch_overhead_share:.2f} of the call's wall time is outside its {count:.0f} kernels, "
        "and they are simple streaming code (shared-memory instructions {shared_share:.2%} of all): "
        "inductor fuses them and replays the result as one CUDA graph",
    ),
    PlaybookRule(
        "launch_bound_chain",
        "cuda_graph",
        "ncu",
        (LAUNCH_SHARE,),
        lambda f: f.m(LAUNCH_SHARE) >= 0.5 and f.v("count") >= 3,
        "launch-bound: {derived__launch_overhead_share:.2f} of the call's wall time is outside its "
        "{count:.0f} kernels: a CUDA graph replays all launches at once, with the same kernels",
    ),
    PlaybookRule(
        "lone_launch_bound_kernel",
        "keep",
        "ncu",
        (LAUNCH_SHARE,),
        lambda f: f.m(LAUNCH_SHARE) >= 0.5 and f.v("count") <= 2,
        "{count:.0f} launch(es), {derived__launch_overhead_share:.2f} of wall time outside them: a graph "
        "saves at most one launch and adds its input copies; fusion has nothing to fuse; keep",
    ),
    PlaybookRule(
        "underfilled_chain",
        "cuda_graph",
        "ncu",
        (WAVES,),
        lambda f: f.m(WAVES) < 1 and f.v("count") >= 3,
        "{count:.0f} kernels averaging {launch__waves_per_multiprocessor:.2f} waves per SM: none fills the "
        "GPU once, so each costs its launch latency; a CUDA graph replays them back to back",
    ),
    PlaybookRule(
        "lone_underfilled_kernel",
        "keep",
        "ncu",
        (WAVES,),
        lambda f: f.m(WAVES) < 1 and f.v("count") <= 2,
        "{count:.0f} kernel(s) under one wave per SM ({launch__waves_per_multiprocessor:.2f}): latency of "
        "a single small launch, which no torch-level rewrite removes; keep",
    ),
    PlaybookRule(
        "short_idle_kernel_chain",
        "cuda_graph",
        "ncu",
        (SM, DRAM),
        lambda f: f.v("count") >= 3 and f.v("mean_us") < SHORT_KERNEL_US and f.m(SM) < 30 and f.m(DRAM) < 30,
        "{count:.0f} kernels of {mean_us:.1f} us on average with SM "
        "{sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% and DRAM "
        "{dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}%: shorter than an eager launch and the "
        "GPU mostly idle; a CUDA graph removes the launch gaps",
    ),
    PlaybookRule(
        "lone_short_idle_kernel",
        "keep",
        "ncu",
        (SM, DRAM),
        lambda f: f.v("count") <= 2 and f.v("mean_us") < SHORT_KERNEL_US and f.m(SM) < 30 and f.m(DRAM) < 30,
        "{count:.0f} kernel(s) of {mean_us:.1f} us with the GPU mostly idle: one launch's latency; keep",
    ),
    # ---- explicit attention ----
    PlaybookRule(
        "materialized_attention",
        "sdpa",
        "ncu",
        (DRAM,),
        lambda f: f.v("attention_share") >= 0.1 and sandwich_dram(f) >= 30,
        "GEMM -> {attention_share:.0%} of the time in memory-bound passes ending in a softmax -> GEMM: the "
        "score matrix of an explicit attention goes through DRAM; a fused attention kernel keeps it on chip",
    ),
    # ---- convolutions ----
    PlaybookRule(
        "conv_layout_transposes",
        "channels_last",
        "ncu",
        (DRAM_READ,),
        lambda f: f.v("layout_share") >= 0.05 and f.v("conv_share") > 0,
        "convolution with NCHW<->NHWC layout transposes taking {layout_share:.0%} of kernel time (extra "
        "DRAM round trips of the activations): channels-last tensors remove them",
    ),
    PlaybookRule(
        "half_conv_off_tensor_cores",
        "cudnn_benchmark",
        "ncu",
        (TENSOR_SHARE,),
        lambda f: (
            f.v("half_conv") and f.v("conv_share") >= 0.3 and f.m(TENSOR_SHARE) < 0.5 * f.v("conv_share")
        ),
        "half-precision convolutions take {conv_share:.0%} of the time but tensor cores only "
        "{derived__tensor_core_time_share:.0%}: cuDNN's heuristic picked CUDA-core algorithms; "
        "benchmarking tries every algorithm for these shapes",
    ),
    PlaybookRule(
        "half_conv_with_streaming_epilogues",
        "channels_last_compile",
        "ncu",
        (L2_HIT,),
        lambda f: (
            f.v("half_conv") and f.v("conv_share") >= 0.3 and f.v("pointwise") >= 0.2 and f.m(L2_HIT) < 60
        ),
        "half-precision convolutions with {pointwise:.0%} of the time in other kernels and an L2 hit rate "
        "of {lts__t_sector_hit_rate_pct:.0f}%: the epilogue passes stream activations through DRAM; "
        "channels-last convs with the epilogues fused by inductor",
    ),
    # ---- compute-bound library code ----
    PlaybookRule(
        "tensor_core_gemm_with_epilogue",
        "compile_max_autotune",
        "ncu",
        (TENSOR_SHARE,),
        lambda f: (
            f.m(TENSOR_SHARE) >= 0.5
            and f.v("library") >= 0.5
            and f.v("pointwise") >= 0.1
            and f.v("count") >= 2
        ),
        "tensor-core GEMMs ({derived__tensor_core_time_share:.0%} of the time) followed by {pointwise:.0%} "
        "in separate elementwise kernels: a Triton GEMM template with the epilogue fused saves that pass; "
        "max-autotune keeps cuBLAS where it is faster",
    ),
    PlaybookRule(
        "tensor_core_bound",
        "keep",
        "ncu",
        (TENSOR_SHARE,),
        lambda f: f.m(TENSOR_SHARE) >= 0.5 and f.v("pointwise") < 0.1,
        "{derived__tensor_core_time_share:.0%} of the time on tensor cores and little else: library GEMMs "
        "near their roof; keep",
    ),
    PlaybookRule(
        "issue_bound",
        "keep",
        "ncu",
        (WARP_LATENCY, stall("selected"), stall("not_selected")),
        lambda f: stall_share(f, "selected") + stall_share(f, "not_selected") >= 0.5,
        "warps are issuing or ready {selected_stall_share:.0%} + {not_selected_stall_share:.0%} of their "
        "time: issue-bound, only fewer instructions help, not fusion, layouts or graphs; keep",
    ),
    PlaybookRule(
        "fma_bound_library",
        "keep",
        "ncu",
        (FMA_PIPE,),
        lambda f: f.m(FMA_PIPE) >= 50 and f.v("library") >= 0.5,
        "GEMM/conv library kernels ({library:.0%} of the time) with the FMA pipe at "
        "{sm__pipe_fma_cycles_active_avg_pct_of_peak_sustained_active:.0f}%: at the CUDA-core peak; keep",
    ),
    PlaybookRule(
        "compute_bound_library",
        "keep",
        "ncu",
        (SM,),
        lambda f: f.m(SM) >= 60 and (f.v("library") >= 0.8 or (f.v("count") <= 3 and f.v("library") >= 0.5)),
        "{count:.0f} kernel(s) at {sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% SM, mostly "
        "GEMM/conv library code ({library:.0%}): near peak, and the rest too small to matter; keep",
    ),
    # ---- memory access ----
    PlaybookRule(
        "uncoalesced_loads",
        "torch_compile",
        "ncu",
        (LOAD_BYTES_PER_SECTOR,),
        lambda f: 0 < f.m(LOAD_BYTES_PER_SECTOR) < 16 and f.v("library") < 0.5,
        "global loads use {smsp__sass_average_data_bytes_per_sector_mem_global_op_ld_ratio:.1f} of each "
        "32-byte sector outside GEMM/conv code: strided access; a generated kernel tiles it",
    ),
    PlaybookRule(
        "memory_latency_bound",
        "compile_coordinate_descent",
        "ncu",
        (WARP_LATENCY, stall("long_scoreboard"), DRAM),
        lambda f: (
            stall_share(f, "long_scoreboard") >= 0.5
            and f.m(DRAM) < 50
            and f.v("library") < 0.5
            and f.v("mean_us") >= SHORT_KERNEL_US
        ),
        "warps wait on global memory {long_scoreboard_stall_share:.0%} of their time while DRAM runs at "
        "{dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}%: latency-bound, too few bytes in "
        "flight (in kernels long enough, >= 15 us, for that to matter more than their launch); generated "
        "kernels with tuned block sizes keep more loads outstanding",
    ),
    PlaybookRule(
        "barrier_bound_reductions",
        "compile_coordinate_descent",
        "ncu",
        (WARP_LATENCY, stall("barrier")),
        lambda f: (
            stall_share(f, "barrier") >= 0.2
            and f.v("reduction_share") >= 0.5
            and f.v("mean_us") >= SHORT_KERNEL_US
        ),
        "reductions ({reduction_share:.0%} of the time) with warps waiting at block barriers "
        "{barrier_stall_share:.0%} of their time: the block size and split of the reduction decide this; "
        "tuned generated reductions",
    ),
    PlaybookRule(
        "occupancy_starved_streaming",
        "compile_coordinate_descent",
        "ncu",
        (ACHIEVED_OCCUPANCY, THEORETICAL_OCCUPANCY, DRAM),
        lambda f: (
            f.m(ACHIEVED_OCCUPANCY) < 40
            and f.m(ACHIEVED_OCCUPANCY) < 0.6 * f.m(THEORETICAL_OCCUPANCY)
            and f.m(DRAM) < 60
            and f.v("library") < 0.5
            and f.metrics.get(WAVES, 1.0) >= 1
            and f.v("mean_us") >= SHORT_KERNEL_US
        ),
        "{sm__warps_active_avg_pct_of_peak_sustained_active:.0f}% of warp slots active (of "
        "{sm__maximum_warps_per_active_cycle_pct:.0f}% possible) with DRAM at "
        "{dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}%: too few warps to hide memory latency; "
        "generated kernels with tuned block sizes",
    ),
    PlaybookRule(
        "chain_through_dram",
        "torch_compile",
        "ncu",
        (L2_HIT,),
        lambda f: f.v("count") >= 2 and f.m(L2_HIT) < 60 and f.v("library") < 0.5,
        "{count:.0f} kernels outside GEMM/conv code with an L2 hit rate of "
        "{lts__t_sector_hit_rate_pct:.0f}%: intermediates make DRAM round trips; fusion keeps them in "
        "registers",
    ),
    PlaybookRule(
        "chain_in_l2",
        "cuda_graph",
        "ncu",
        (L2_HIT,),
        lambda f: f.v("count") >= 3 and f.m(L2_HIT) >= 80 and f.v("library") < 0.5 and f.v("mean_us") < 50,
        "{count:.0f} short kernels ({mean_us:.1f} us) hitting L2 {lts__t_sector_hit_rate_pct:.0f}% of the "
        "time: intermediates stay in the 50 MB L2, so fusion saves little DRAM; the launches are what is "
        "left, and a CUDA graph removes them",
    ),
    PlaybookRule(
        "pointwise_chain",
        "torch_compile",
        "ncu",
        (INSTRUCTIONS, SHARED_LOADS, SHARED_STORES),
        lambda f: f.v("count") >= 2 and f.v("shared_share") < 0.01 and f.v("library") < 0.5,
        "{count:.0f} kernels of streaming code (shared-memory instructions {shared_share:.2%} of all): "
        "each loads and stores whole tensors; fusion removes the intermediate loads and stores",
    ),
    PlaybookRule(
        "l2_bound_strided_access",
        "torch_compile",
        "ncu",
        (L2_THROUGHPUT, SM, DRAM),
        lambda f: f.m(L2_THROUGHPUT) >= 80 and f.m(DRAM) < 40 and f.m(SM) < 40 and f.v("library") < 0.5,
        "L2 at {lts__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% while DRAM is at "
        "{dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% and SM at "
        "{sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}%: sectors fetched and re-fetched for a "
        "few bytes each (strided access); a generated kernel tiles it",
    ),
    PlaybookRule(
        "single_kernel_at_bandwidth",
        "keep",
        "ncu",
        (LOAD_BYTES_PER_SECTOR, DRAM),
        lambda f: f.v("count") == 1 and f.m(DRAM) >= 60 and f.m(LOAD_BYTES_PER_SECTOR) >= 28,
        "one kernel at {dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% of DRAM bandwidth with "
        "coalesced loads: nothing to fuse, no torch-level rewrite beats it; keep",
    ),
    PlaybookRule(
        "lone_kernel_at_a_roof",
        "keep",
        "ncu",
        (MEMORY_THROUGHPUT, SM),
        lambda f: f.v("count") == 1 and max(f.m(SM), f.m(MEMORY_THROUGHPUT)) >= 60,
        "one kernel at {sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% SM / "
        "{gpu__compute_memory_throughput_avg_pct_of_peak_sustained_elapsed:.0f}% memory throughput: at a "
        "roof with nothing to fuse; keep",
    ),
    PlaybookRule(
        "lone_kernel_near_peak",
        "keep",
        "ncu",
        (SM, DRAM),
        lambda f: f.v("count") == 1 and max(f.m(SM), f.m(DRAM)) >= 60,
        "one kernel at {sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% SM / "
        "{dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% DRAM: near a roof with nothing to fuse; "
        "keep",
    ),
    PlaybookRule(
        "memory_bound_chain",
        "torch_compile",
        "ncu",
        (DRAM,),
        lambda f: f.v("count") >= 2 and f.m(DRAM) >= 40 and f.v("library") < 0.5,
        "memory-bound chain: {dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% DRAM over "
        "{count:.0f} kernels outside GEMM/conv code; fusing them saves the round trips",
    ),
    PlaybookRule(
        "low_intensity_chain",
        "torch_compile",
        "ncu",
        (INTENSITY,),
        lambda f: f.m(INTENSITY) < 10 and f.v("count") >= 2 and f.v("library") < 0.5,
        "low arithmetic intensity ({derived__arithmetic_intensity:.1f} FLOP/B) over {count:.0f} kernels: "
        "traffic-bound, fusion cuts the bytes",
    ),
    PlaybookRule(
        "high_intensity_few_kernels",
        "keep",
        "ncu",
        (INTENSITY,),
        lambda f: f.m(INTENSITY) >= 50 and f.v("count") <= 3,
        "{count:.0f} kernel(s) at {derived__arithmetic_intensity:.0f} FLOP/B: dense math that torch-level "
        "rewrites at this precision do not improve; keep",
    ),
)


TORCH_RULES: tuple[PlaybookRule, ...] = (
    PlaybookRule(
        "torch_matmul_heavy_tf32",
        "tf32",
        "torch",
        ("torch__matmul_time_share",),
        lambda f: f.tolerances.tf32 and f.m("torch__matmul_time_share") >= 0.6,
        "{torch__matmul_time_share:.0%} of operator time in matmul/conv and the tolerance allows TF32",
    ),
    PlaybookRule(
        "torch_ridge_matmul_loose",
        "autocast_bf16",
        "torch",
        ("torch__arithmetic_intensity",),
        lambda f: (
            f.tolerances.bf16
            and 10 <= f.m("torch__arithmetic_intensity") < 50
            and f.v("matmul_op_share") >= 0.5
        ),
        "matmul/conv operators ({matmul_op_share:.0%} of the time) at {torch__arithmetic_intensity:.0f} "
        "FLOP/B of inputs and parameters: bf16 autocast halves the bytes, the loose tolerance allows it",
    ),
    PlaybookRule(
        "torch_ridge_matmul",
        "autocast_fp16",
        "torch",
        ("torch__arithmetic_intensity",),
        lambda f: (
            f.tolerances.fp16
            and 10 <= f.m("torch__arithmetic_intensity") < 50
            and f.v("matmul_op_share") >= 0.5
        ),
        "matmul/conv operators ({matmul_op_share:.0%} of the time) at {torch__arithmetic_intensity:.0f} "
        "FLOP/B of inputs and parameters: fp16 autocast halves the bytes, the tolerance allows it",
    ),
    PlaybookRule(
        "torch_launch_bound_pointwise",
        "compile_cudagraphs",
        "torch",
        ("torch__launch_overhead_share", "torch__elementwise_time_share"),
        lambda f: f.m("torch__launch_overhead_share") >= 0.5 and f.m("torch__elementwise_time_share") >= 0.5,
        "{torch__launch_overhead_share:.2f} of wall time outside operators, "
        "{torch__elementwise_time_share:.0%} of operator time elementwise: fuse them and replay one graph",
    ),
    PlaybookRule(
        "torch_launch_bound",
        "cuda_graph",
        "torch",
        ("torch__launch_overhead_share",),
        lambda f: f.m("torch__launch_overhead_share") >= 0.5,
        "launch/dispatch-bound: {torch__launch_overhead_share:.2f} of the call's wall time is outside "
        "operators; a CUDA graph replays all launches at once",
    ),
    PlaybookRule(
        "torch_many_short_ops",
        "cuda_graph",
        "torch",
        ("torch__op_count", "torch__mean_op_time_us"),
        lambda f: f.m("torch__op_count") >= 8 and f.m("torch__mean_op_time_us") < 20,
        "{torch__op_count:.0f} operators averaging {torch__mean_op_time_us:.1f} us: dispatch-bound, a CUDA "
        "graph removes the per-operator overhead",
    ),
    PlaybookRule(
        "torch_explicit_attention",
        "sdpa",
        "torch",
        ("torch__reduction_time_share",),
        lambda f: (
            f.v("softmax_ops") >= 1 and f.v("matmul_ops") >= 2 and f.m("torch__reduction_time_share") >= 0.1
        ),
        "a softmax between matmuls with {torch__reduction_time_share:.0%} of operator time in reductions: "
        "explicit attention materializing its scores; a fused attention operator avoids that",
    ),
    PlaybookRule(
        "torch_conv_with_copies",
        "channels_last",
        "torch",
        ("torch__copy_time_share",),
        lambda f: f.m("torch__copy_time_share") >= 0.05 and f.v("conv_share") > 0.2,
        "convolutions ({conv_share:.0%} of operator time) with {torch__copy_time_share:.0%} of time in "
        "copies/layout conversions: channels-last tensors remove them",
    ),
    PlaybookRule(
        "torch_reduction_heavy",
        "compile_coordinate_descent",
        "torch",
        ("torch__reduction_time_share",),
        lambda f: f.m("torch__reduction_time_share") >= 0.5,
        "{torch__reduction_time_share:.0%} of operator time in reductions: generated reductions with tuned "
        "block sizes",
    ),
    PlaybookRule(
        "torch_intermediate_heavy",
        "torch_compile",
        "torch",
        ("torch__memory_allocated_bytes", "torch__io_bytes"),
        lambda f: (
            f.m("torch__io_bytes") > 0
            and f.m("torch__memory_allocated_bytes") >= 2 * f.m("torch__io_bytes")
            and f.v("matmul_op_share") < 0.5
        ),
        "operators allocate {torch__memory_allocated_bytes:.3g} B for {torch__io_bytes:.3g} B of inputs and "
        "outputs: intermediates written and read back; fusion keeps them out of memory",
    ),
    PlaybookRule(
        "torch_elementwise_chain",
        "torch_compile",
        "torch",
        ("torch__elementwise_time_share",),
        lambda f: f.m("torch__elementwise_time_share") >= 0.3,
        "{torch__elementwise_time_share:.0%} of operator time in elementwise ops: fusion (torch.compile) "
        "removes the intermediate tensors",
    ),
    PlaybookRule(
        "torch_high_intensity_few_ops",
        "keep",
        "torch",
        ("torch__arithmetic_intensity", "torch__op_count"),
        lambda f: f.m("torch__arithmetic_intensity") >= 50 and f.m("torch__op_count") <= 3,
        "{torch__op_count:.0f} operator(s) at {torch__arithmetic_intensity:.0f} FLOP/B: dense library math; "
        "keep",
    ),
    PlaybookRule(
        "torch_single_library_op",
        "keep",
        "torch",
        ("torch__matmul_time_share", "torch__elementwise_time_share"),
        lambda f: f.m("torch__matmul_time_share") >= 0.8 and f.m("torch__elementwise_time_share") < 0.1,
        "{torch__matmul_time_share:.0%} of operator time in library matmul/conv, little else: keep",
    ),
    PlaybookRule(
        "torch_dominant_op",
        "keep",
        "torch",
        ("torch__top_op_time_share",),
        lambda f: f.m("torch__top_op_time_share") >= 0.9,
        "one operator holds {torch__top_op_time_share:.0%} of operator time: nothing around it to fuse; keep",
    ),
)
