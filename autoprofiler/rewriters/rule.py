"""RuleRewriter: profile-guided, torch-level rewrites decided by documented rules. No LLM, no GPU needed.

Every candidate is built the same way (``source_for``; the builders live in ``actions.py``, shared with
the playbook rewriter): the task source is copied with ``class Model`` renamed to ``_Original`` (every
``Model`` name token, so ``super(Model, self)`` follows), then

    class ModelNew(nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()
            self.inner = _Original(*args, **kwargs)   # same seed => same parameters as the reference
            ...                                        # the action

so the candidate never touches the evaluator's reference ``Model`` and has the same constructor
signature. The actions (``ACTIONS``):

``keep``           ModelNew = a copy of the original (never wrong, never faster: reward 0).
``torch_compile``  ``torch.compile`` of the copy (``compile_mode``, default ``"default"``): fuses chains of
                   elementwise/reduction ops into Triton kernels (C++ on CPU).
``cuda_graph``     captures the forward into a CUDA graph with static input buffers; each call copies the
                   inputs in, replays, and returns clones of the static outputs (fresh tensors per call).
                   Re-captures when the input shapes/dtypes/strides change; plain forward off CUDA.
``tf32``           TF32 for fp32 matmul and convolution inside ``forward`` only (the flags are restored
                   afterwards, so the reference is untouched). Only chosen when the allowed tolerance
                   (``tolerance``) is at least ``tf32_min_tolerance``: TF32 keeps 10 mantissa bits and
                   fails the evaluator's fp32 default of 1e-4 on long reductions.
``channels_last``  4-D/5-D parameters and inputs in channels-last layout and ``cudnn.benchmark`` on during
                   ``forward`` (restored afterwards): removes NCHW<->NHWC transposes around cuDNN convs.

The decision (``decide``) walks ``RULES`` in order; the first rule whose metrics are all present in the
profile it is shown and whose condition holds names the action. A rule whose metrics are absent is
skipped (the rewriter sees only what was profiled), and when no rule fires the default action is taken
(``torch_compile``: the one torch-level rewrite that helps broadly on a GPU, fusing elementwise chains;
``keep`` would make every blind rewrite worthless, which flatters profiling). See ``RULES`` for each
rule's code. The list, in order (ncu names verbatim; first match wins):

============================== ============= =====================================================
rule                           action        fires when (all named metrics shown)
============================== ============= =====================================================
launch_bound_small_kernels     cuda_graph    [occupancy] launch share >= 0.5, >= 3 kernels, < 4 waves/SM
single_small_launch            keep          [occupancy] launch share >= 0.5 with <= 2 kernels
fp32_gemm_without_tensor_cores tf32          [tensor_cores] tolerance allows, tensor cores idle, SM >= 50%
compute_bound_library_kernel   keep          [compute_pipes] SM >= 60%, <= 3 kernels, GEMM/conv > 50% of time
conv_layout_transposes         channels_last [DRAM bytes] layout kernels >= 5% of time, a conv kernel
uncoalesced_loads              torch_compile [memory] loads use < 16 of 32 B per sector, GEMM/conv < 50%
memory_bound_chain             torch_compile [DRAM bytes] DRAM >= 40% over >= 2 kernels
single_kernel_at_bandwidth     keep          [memory] DRAM >= 60%, one kernel, loads >= 28 B per sector
low_intensity_chain            torch_compile [flops] arithmetic intensity < 10 FLOP/B over >= 2 kernels
high_intensity_few_kernels     keep          [flops] arithmetic intensity >= 50 FLOP/B, <= 3 kernels
torch_launch_bound             cuda_graph    torch__launch_overhead_share >= 0.5
torch_many_short_ops           cuda_graph    torch__op_count >= 8 and torch__mean_op_time_us < 20
torch_matmul_heavy_tf32        tf32          tolerance allows, torch__matmul_time_share >= 0.6
torch_conv_with_copies         channels_last torch__copy_time_share >= 0.05, conv ops > 20% of time
torch_elementwise_chain        torch_compile torch__elementwise_time_share >= 0.3
torch_single_library_op        keep          torch__matmul_time_share >= 0.8, elementwise < 0.1
============================== ============= =====================================================

Each ncu rule needs a metric of a group beyond the root and speed-of-light metrics (in brackets; "DRAM
bytes", ``dram__bytes_read.sum``, is in both the memory and the flops group), so
what the rewriter can conclude depends on what was profiled, as it does for an LLM shown a profile:
shown only the root, it takes the default; shown occupancy, it can see launch-bound work; shown memory,
strided or chained traffic; shown compute pipes or tensor cores, library GEMMs; shown FLOP counts, the
arithmetic intensity. Launch overhead comes first because a CUDA graph is the only action that removes
it (but a graph of one or two launches only adds its input copies); TF32 before layout and fusion
because on an fp32 GEMM/conv it is the largest single gain when allowed; ``keep`` for library GEMMs and
a lone kernel already at a roof, where torch-level rewrites only add overhead.

History: ``rule-v1`` let its first rules fire on root/speed-of-light metrics that every fixed
configuration contains, so on the first H200 recording (``datasets/h200_suite``) all four
configurations made the same choice on all 32 fully profiled tasks and what was profiled did not
matter. ``rule-v2`` (this list) was written after that observation, each rule from a physical
argument, but with that recording's metrics and outcomes in view (e.g. the 4-waves bound separates
conv2d from conv_bn_relu there): that recording is not an independent test of these rules. Bump
``RULE_VERSION`` whenever a rule or threshold changes: it is the rewriter's identity in reward keys of
configuration rows; bump ``ACTIONS_VERSION`` whenever a candidate builder changes (it keys action rows).

Example::

    rewriter = RuleRewriter()
    action, reason = rewriter.decide(profile)         # e.g. ("cuda_graph", "launch-bound: ...")
    rewrite = rewriter.rewrite(task, profile)         # Rewrite(source=..., action="cuda_graph", ...)
    source = rewriter.source_for(task, "tf32")        # any action's candidate (for replay tables)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from autoprofiler.rewriters.actions import ACTIONS as CATALOG
from autoprofiler.rewriters.actions import (
    ACTIONS_VERSION,
    ORIGINAL_NAME,
    RULE_ACTIONS,
    Action,
    FixedAction,
    action_rewrite,
    build_source,
    check_choices,
    rename_model,
    settings_identity,
)
from autoprofiler.rewriters.base import Rewrite
from autoprofiler.rewriters.evidence import (
    CONV_KERNELS,
    CONV_OPS,
    DRAM,
    DRAM_READ,
    DURATION,
    FMA_PIPE,
    GEMM_KERNELS,
    INTENSITY,
    KERNELS,
    LAUNCH_SHARE,
    LAYOUT_KERNELS,
    LOAD_BYTES_PER_SECTOR,
    SM,
    TENSOR_SHARE,
    TORCH_DURATION,
    WAVES,
    kernel_time_share,
    number,
)

logger = logging.getLogger(__name__)

__all__ = [  # the candidate builders and metric names live in actions.py / evidence.py; re-exported here
    "ACTIONS",
    "ACTIONS_VERSION",
    "CONV_KERNELS",
    "DRAM",
    "DRAM_READ",
    "DURATION",
    "FMA_PIPE",
    "GEMM_KERNELS",
    "INTENSITY",
    "KERNELS",
    "LAUNCH_SHARE",
    "LAYOUT_KERNELS",
    "LOAD_BYTES_PER_SECTOR",
    "ORIGINAL_NAME",
    "RULES",
    "RULE_VERSION",
    "SM",
    "TENSOR_SHARE",
    "WAVES",
    "FixedAction",
    "Rule",
    "RuleRewriter",
    "build_source",
    "kernel_time_share",
    "rename_model",
]

RULE_VERSION = "rule-v2"  # the decision rules: configuration rows are keyed by it
# The candidate builders (``actions.py``): action rows are keyed by ACTIONS_VERSION (see RuleRewriter).
ACTIONS: dict[str, Action] = {name: CATALOG[name] for name in RULE_ACTIONS}


# ------------------------------------------------------------------------------------------------
# Decision rules
# ------------------------------------------------------------------------------------------------
# ncu metric names verbatim and kernel-name families: autoprofiler/rewriters/evidence.py.


@dataclass(frozen=True)
class Rule:
    """One entry of the decision list.

    Attributes:
        name: a short id (reported in the reason).
        action: the action it picks when it fires.
        source: ``"ncu"`` or ``"torch"``: the profile source it reads.
        needs: metric names (verbatim) that must all be in the shown profile; otherwise the rule is
            skipped. ``()`` for rules that read the per-kernel table (which must then be non-empty).
        test: ``test(metrics, kernels, rewriter) -> bool``.
        why: the reason, ``str.format``-ed with the metrics (keys with ``.`` replaced by ``_``).
    """

    name: str
    action: str
    source: str
    needs: tuple[str, ...]
    test: Callable[[dict, list, RuleRewriter], bool]
    why: str


def _tf32_allowed(rewriter: RuleRewriter) -> bool:
    return rewriter.tolerance >= rewriter.tf32_min_tolerance


RULES: tuple[Rule, ...] = (
    # ---- ncu (the H200) ----
    # Every ncu rule needs a metric of one non-root group, so what the rewriter can conclude depends on
    # what was profiled, as it does for an LLM: occupancy (latency) -> cuda_graph / keep; tensor_cores and
    # compute_pipes (compute) -> tf32 / keep; memory (memory) -> channels_last / torch_compile / keep;
    # flops (algorithm) -> torch_compile / keep. speed_of_light and root metrics only qualify a rule.
    Rule(
        "launch_bound_small_kernels",
        "cuda_graph",
        "ncu",
        (LAUNCH_SHARE, WAVES, KERNELS),
        lambda m, k, r: m[LAUNCH_SHARE] >= 0.5 and m[KERNELS] >= 3 and m[WAVES] < 4,
        "launch-bound: {derived__launch_overhead_share:.2f} of the call's wall time is outside its "
        "{derived__kernel_count:.0f} kernels, each under 4 waves per SM "
        "({launch__waves_per_multiprocessor:.2f}): "
        "a CUDA graph replays all launches at once",
    ),
    Rule(
        "single_small_launch",
        "keep",
        "ncu",
        (LAUNCH_SHARE, WAVES, KERNELS),
        lambda m, k, r: m[LAUNCH_SHARE] >= 0.5 and m[KERNELS] <= 2,
        "{derived__kernel_count:.0f} short launch(es) ({derived__launch_overhead_share:.2f} of wall time "
        "outside kernels): a graph saves at most one launch but adds its input copies; keep",
    ),
    Rule(
        "fp32_gemm_without_tensor_cores",
        "tf32",
        "ncu",
        (TENSOR_SHARE, SM),
        lambda m, k, r: _tf32_allowed(r) and m[TENSOR_SHARE] < 0.05 and m[SM] >= 50,
        "compute-bound ({sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% SM) with tensor cores idle "
        "({derived__tensor_core_time_share:.2f} of time): fp32 math on CUDA cores; TF32 moves it to "
        "tensor cores (the tolerance allows it)",
    ),
    Rule(
        "compute_bound_library_kernel",
        "keep",
        "ncu",
        (FMA_PIPE, SM, KERNELS),
        lambda m, k, r: m[SM] >= 60 and m[KERNELS] <= 3 and kernel_time_share(k, GEMM_KERNELS) > 0.5,
        "{derived__kernel_count:.0f} kernel(s) at "
        "{sm__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% SM, mostly GEMM/conv library code (FMA pipe "
        "{sm__pipe_fma_cycles_active_avg_pct_of_peak_sustained_active:.0f}%): near peak, keep it",
    ),
    Rule(
        "conv_layout_transposes",
        "channels_last",
        "ncu",
        (DRAM_READ,),
        lambda m, k, r: (
            kernel_time_share(k, LAYOUT_KERNELS) >= 0.05 and kernel_time_share(k, CONV_KERNELS) > 0
        ),
        "convolution with NCHW<->NHWC layout transposes taking {layout_share:.0%} of kernel time (extra "
        "DRAM round trips): channels-last tensors remove them",
    ),
    Rule(
        "uncoalesced_loads",
        "torch_compile",
        "ncu",
        (LOAD_BYTES_PER_SECTOR,),
        lambda m, k, r: 0 < m[LOAD_BYTES_PER_SECTOR] < 16 and kernel_time_share(k, GEMM_KERNELS) < 0.5,
        "global loads use {smsp__sass_average_data_bytes_per_sector_mem_global_op_ld_ratio:.1f} of each "
        "32-byte sector outside GEMM/conv code: strided access; a generated (torch.compile) kernel "
        "reorders it",
    ),
    Rule(
        "memory_bound_chain",
        "torch_compile",
        "ncu",
        (DRAM_READ, DRAM, KERNELS),
        lambda m, k, r: m[DRAM] >= 40 and m[KERNELS] >= 2,
        "memory-bound chain: {dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% DRAM over "
        "{derived__kernel_count:.0f} kernels; fusing them (torch.compile) saves the round trips",
    ),
    Rule(
        "single_kernel_at_bandwidth",
        "keep",
        "ncu",
        (LOAD_BYTES_PER_SECTOR, DRAM, KERNELS),
        lambda m, k, r: m[DRAM] >= 60 and m[KERNELS] <= 1 and m[LOAD_BYTES_PER_SECTOR] >= 28,
        "one kernel at {dram__throughput_avg_pct_of_peak_sustained_elapsed:.0f}% of DRAM bandwidth with "
        "coalesced loads: nothing to fuse, no torch-level rewrite beats it",
    ),
    Rule(
        "low_intensity_chain",
        "torch_compile",
        "ncu",
        (INTENSITY, KERNELS),
        lambda m, k, r: m[INTENSITY] < 10 and m[KERNELS] >= 2,
        "low arithmetic intensity ({derived__arithmetic_intensity:.1f} FLOP/B) over "
        "{derived__kernel_count:.0f} kernels: traffic-bound, fusion (torch.compile) cuts the bytes",
    ),
    Rule(
        "high_intensity_few_kernels",
        "keep",
        "ncu",
        (INTENSITY, KERNELS),
        lambda m, k, r: m[INTENSITY] >= 50 and m[KERNELS] <= 3,
        "{derived__kernel_count:.0f} kernel(s) at {derived__arithmetic_intensity:.0f} FLOP/B: dense "
        "library math (GEMM/conv) that torch-level rewrites do not improve; keep it",
    ),
    # ---- torch.profiler (CPU or GPU) ----
    Rule(
        "torch_launch_bound",
        "cuda_graph",
        "torch",
        ("torch__launch_overhead_share",),
        lambda m, k, r: m["torch__launch_overhead_share"] >= 0.5,
        "launch/dispatch-bound: {torch__launch_overhead_share:.2f} of the call's wall time is outside "
        "operators (>= 0.50); a CUDA graph replays all launches at once",
    ),
    Rule(
        "torch_many_short_ops",
        "cuda_graph",
        "torch",
        ("torch__op_count", "torch__mean_op_time_us"),
        lambda m, k, r: m["torch__op_count"] >= 8 and m["torch__mean_op_time_us"] < 20,
        "{torch__op_count:.0f} operators averaging {torch__mean_op_time_us:.1f} us (< 20 us): "
        "dispatch-bound, a CUDA graph removes the per-op overhead",
    ),
    Rule(
        "torch_matmul_heavy_tf32",
        "tf32",
        "torch",
        ("torch__matmul_time_share",),
        lambda m, k, r: _tf32_allowed(r) and m["torch__matmul_time_share"] >= 0.6,
        "{torch__matmul_time_share:.0%} of operator time in matmul/conv and the tolerance allows TF32",
    ),
    Rule(
        "torch_conv_with_copies",
        "channels_last",
        "torch",
        ("torch__copy_time_share",),
        lambda m, k, r: m["torch__copy_time_share"] >= 0.05 and _torch_conv_share(k) > 0.2,
        "convolutions ({conv_share:.0%} of operator time) with {torch__copy_time_share:.0%} of time in "
        "copies/layout conversions: channels-last tensors remove them",
    ),
    Rule(
        "torch_elementwise_chain",
        "torch_compile",
        "torch",
        ("torch__elementwise_time_share",),
        lambda m, k, r: m["torch__elementwise_time_share"] >= 0.3,
        "{torch__elementwise_time_share:.0%} of operator time in elementwise ops: fusion (torch.compile) "
        "removes the intermediate tensors",
    ),
    Rule(
        "torch_single_library_op",
        "keep",
        "torch",
        ("torch__matmul_time_share", "torch__elementwise_time_share"),
        lambda m, k, r: m["torch__matmul_time_share"] >= 0.8 and m["torch__elementwise_time_share"] < 0.1,
        "{torch__matmul_time_share:.0%} of operator time in one library matmul/conv, little else: keep it",
    ),
)


def _torch_conv_share(kernels: list[dict]) -> float:
    return kernel_time_share(kernels, CONV_OPS, TORCH_DURATION)


def _reason_values(metrics: dict, kernels: list) -> dict:
    values = {name.replace(".", "_"): value for name, value in metrics.items()}
    count = metrics.get(KERNELS)
    if count and metrics.get(DURATION) is not None:
        values["mean_kernel_us"] = metrics[DURATION] / count / 1000.0
    values["layout_share"] = kernel_time_share(kernels, LAYOUT_KERNELS)
    values["conv_share"] = _torch_conv_share(kernels)
    return values


class RuleRewriter:
    """Profile-guided torch-level rewrites (see the module docstring for the actions and ``RULES``).

    Parameters:
        default_action: the action when no rule fires or nothing was profiled (``"torch_compile"``).
        compile_mode: ``torch.compile`` mode for ``torch_compile`` (``"default"``, ``"max-autotune"``,
            ``"max-autotune-no-cudagraphs"``, ``"reduce-overhead"``).
        tolerance: the absolute/relative tolerance the evaluator will apply to fp32 outputs (its default
            is 1e-4).
        tf32_min_tolerance: the rules pick ``tf32`` only when ``tolerance`` is at least this (1e-2).
        rules: the decision list (default ``RULES``).

    ``identity`` is ``"rule-v2"`` with the defaults, else ``"rule-v2[name=value,...]"`` listing the
    parameters that differ, so reward rows of differently configured rewriters never mix. It keys the
    rows of configurations (what the rules chose when shown some groups). ``actions_identity``
    (``"rule-v1"``: the candidate builders' version, ``ACTIONS_VERSION``) keys the rows of single actions,
    which do not depend on the rules: changing a rule re-uses every recorded action evaluation.
    """

    DEFAULTS = {
        "default_action": "torch_compile",
        "compile_mode": "default",
        "tolerance": 1e-4,
        "tf32_min_tolerance": 1e-2,
    }

    def __init__(
        self,
        default_action: str = "torch_compile",
        compile_mode: str = "default",
        tolerance: float = 1e-4,
        tf32_min_tolerance: float = 1e-2,
        rules: tuple[Rule, ...] = RULES,
    ):
        check_choices(default_action, rules, ACTIONS)
        self.default_action = default_action
        self.compile_mode = compile_mode
        self.tolerance = float(tolerance)
        self.tf32_min_tolerance = float(tf32_min_tolerance)
        self.rules = tuple(rules)
        settings = {
            "default_action": default_action,
            "compile_mode": compile_mode,
            "tolerance": self.tolerance,
            "tf32_min_tolerance": self.tf32_min_tolerance,
        }
        self.identity = settings_identity(RULE_VERSION, settings, self.DEFAULTS, rules, RULES)
        # Action rows hold one candidate's evaluation, whatever the rules would choose: they depend only on
        # the candidate builders (and compile_mode), so new rules re-use every recorded action outcome.
        built = "" if compile_mode == self.DEFAULTS["compile_mode"] else f"[compile_mode={compile_mode}]"
        self.actions_identity = ACTIONS_VERSION + built

    @staticmethod
    def actions() -> list[str]:
        """Every action's name: ``['keep', 'torch_compile', 'cuda_graph', 'tf32', 'channels_last']``."""
        return list(ACTIONS)

    def source_for(self, task, action: str) -> str:
        """The candidate source for ``action`` on ``task`` (any of its actions, whatever the rules say)."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {sorted(ACTIONS)}, got {action!r}")
        return build_source(task.source, action, compile_mode=self.compile_mode)

    def for_action(self, action: str) -> FixedAction:
        """A rewriter writing ``action``'s candidate whatever it is shown (identity: ``actions_identity``)."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {sorted(ACTIONS)}, got {action!r}")
        return FixedAction(self, action)

    def decide(self, profile) -> tuple[str, str]:
        """``(action, reason)`` from the metrics of the shown ``profile`` (None: blind -> the default).

        Example::

            >>> RuleRewriter().decide(None)
            ('torch_compile', 'no profile: default action torch_compile')
        """
        if profile is None:
            return self.default_action, f"no profile: default action {self.default_action}"
        metrics = {name: float(v) for name, v in (profile.metrics or {}).items() if number(v) is not None}
        kernels = list(getattr(profile, "kernels", None) or [])
        source = getattr(profile, "source", "ncu")
        for rule in self.rules:
            if rule.source != source:
                continue
            if not all(name in metrics for name in rule.needs):
                continue
            if not rule.needs and not kernels:
                continue
            if rule.test(metrics, kernels, self):
                why = rule.why.format(**_reason_values(metrics, kernels))
                return rule.action, f"{rule.name}: {why}"
        shown = ", ".join(sorted(profile.groups)) if getattr(profile, "groups", None) else "no groups"
        return (
            self.default_action,
            f"no rule fired on the {source} profile ({shown}): default action {self.default_action}",
        )

    def rewrite(self, task, profile) -> Rewrite:
        """Decide from ``profile`` and build that action's candidate; a task it cannot copy gives an error."""
        return action_rewrite(self, task, *self.decide(profile))
