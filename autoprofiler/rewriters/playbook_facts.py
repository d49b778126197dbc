"""What the playbook's rules read and how they are written: ``Facts``, ``PlaybookRule``, the guards.

``Facts`` is the shown profile as rules read it: the metrics (verbatim names), the kernel table and what
follows from it (``evidence.py``: kernel count and durations, share of time in GEMM/conv library code,
fp32 or half-precision convolutions, the explicit-attention kernel sequence), and ratios of metrics of
one group (shared-memory share of instructions, stall shares, fp32 share of FLOPs), present only when
that group is shown. ``vetoed`` is the one guard: actions that make cuDNN re-pick an fp32 convolution's
algorithm are unsafe below a TF32-sized tolerance. The rules themselves: ``playbook_rules.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autoprofiler.rewriters.evidence import (
    CONV_KERNELS,
    CONV_OPS,
    DRAM,
    DURATION,
    FADD,
    FFMA,
    FLOPS,
    FMUL,
    GEMM_KERNELS,
    INSTRUCTIONS,
    LAYOUT_KERNELS,
    MATMUL_OPS,
    REDUCTION_KERNELS,
    SHARED_LOADS,
    SHARED_STORES,
    SOFTMAX_OPS,
    TORCH_DURATION,
    WARP_LATENCY,
    attention_sandwich,
    fp32_convolutions,
    half_convolutions,
    kernel_time_share,
    names_matching,
    number,
    stall,
    total_duration,
)

# Launch overhead: PyTorch's eager path spends roughly 5-20 us of CPU per operator (Python, dispatcher,
# launch), so kernels shorter than this on average leave the GPU waiting for the CPU.
SHORT_KERNEL_US = 15.0


@dataclass(frozen=True)
class Tolerances:
    """What reduced precision the evaluator's tolerance allows (``PlaybookRewriter`` parameters)."""

    tolerance: float = 1e-4
    tf32_min: float = 1e-2
    fp16_min: float = 1e-2
    bf16_min: float = 1e-1

    @property
    def tf32(self) -> bool:
        return self.tolerance >= self.tf32_min

    @property
    def fp16(self) -> bool:
        return self.tolerance >= self.fp16_min

    @property
    def bf16(self) -> bool:
        return self.tolerance >= self.bf16_min


@dataclass
class Facts:
    """The shown profile as the rules read it: metrics, the kernel table and what follows from it."""

    source: str
    metrics: dict[str, float]
    kernels: list[dict]
    tolerances: Tolerances
    values: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, profile, tolerances: Tolerances) -> Facts:
        metrics = {name: float(v) for name, v in (profile.metrics or {}).items() if number(v) is not None}
        facts = cls(profile.source, metrics, list(profile.kernels or []), tolerances)
        facts.values = facts._derive()
        return facts

    def m(self, name: str) -> float:
        return self.metrics[name]

    def _derive(self) -> dict[str, float]:
        k = self.kernels
        if self.source == "torch":
            total = total_duration(k, TORCH_DURATION)
            return {
                "conv_share": kernel_time_share(k, CONV_OPS, TORCH_DURATION),
                "matmul_ops": float(len(names_matching(k, MATMUL_OPS))),
                "matmul_op_share": kernel_time_share(k, MATMUL_OPS + "|" + CONV_OPS, TORCH_DURATION),
                "softmax_ops": float(len(names_matching(k, SOFTMAX_OPS))),
                "op_time_us": total,
            }
        count = len(k)
        total_us = total_duration(k) / 1e3
        library = kernel_time_share(k, GEMM_KERNELS)
        values = {
            "count": float(count),
            "total_us": total_us,
            "mean_us": total_us / count if count else 0.0,
            "library": library,
            "pointwise": 1.0 - library if count else 0.0,
            "conv_share": kernel_time_share(k, CONV_KERNELS),
            "layout_share": kernel_time_share(k, LAYOUT_KERNELS),
            "reduction_share": kernel_time_share(k, REDUCTION_KERNELS),
            "attention_share": attention_sandwich(k),
            "fp32_conv": float(fp32_convolutions(k)),
            "half_conv": float(half_convolutions(k)),
        }
        m = self.metrics
        if INSTRUCTIONS in m and SHARED_LOADS in m and SHARED_STORES in m:
            values["shared_share"] = (
                (m[SHARED_LOADS] + m[SHARED_STORES]) / m[INSTRUCTIONS] if m[INSTRUCTIONS] else 0
            )
        if FLOPS in m and FFMA in m and FADD in m and FMUL in m:
            values["fp32_flop_share"] = (2 * m[FFMA] + m[FADD] + m[FMUL]) / m[FLOPS] if m[FLOPS] else 0.0
        if WARP_LATENCY in m and m[WARP_LATENCY] > 0:
            for reason in ("long_scoreboard", "barrier", "selected", "not_selected", "gmma"):
                if stall(reason) in m:
                    values[f"{reason}_stall_share"] = m[stall(reason)] / m[WARP_LATENCY]
        return values

    def v(self, name: str) -> float:
        return self.values.get(name, 0.0)

    def format(self, template: str) -> str:
        fields = {name.replace(".", "_"): value for name, value in self.metrics.items()}
        return template.format(**{**fields, **self.values})


@dataclass(frozen=True)
class PlaybookRule:
    """One entry of the decision list.

    Attributes:
        name: a short id (reported in the reason and in the docs table).
        action: the action it picks when it fires (an ``actions.ACTIONS`` name).
        source: ``"ncu"`` or ``"torch"``.
        needs: metric names (verbatim) that must all be shown; ``needs[0]``'s group is the evidence.
        test: ``test(facts) -> bool``.
        why: the reason, ``str.format``-ed with the metrics (``.`` -> ``_``) and the derived facts.
    """

    name: str
    action: str
    source: str
    needs: tuple[str, ...]
    test: Callable[[Facts], bool]
    why: str


def stall_share(f: Facts, reason: str) -> float:
    return f.v(f"{reason}_stall_share")


def sandwich_dram(f: Facts) -> float:
    """Duration-weighted DRAM throughput over the kernels between the attention GEMMs (task value if the
    kernel rows lack it)."""
    rows = [r for r in f.kernels if number(r.get(DRAM)) is not None and number(r.get(DURATION))]
    if not rows:
        return f.metrics.get(DRAM, 0.0)
    weight = sum(r[DURATION] for r in rows if not _is_library(r))
    if weight <= 0:
        return f.metrics.get(DRAM, 0.0)
    return sum(r[DRAM] * r[DURATION] for r in rows if not _is_library(r)) / weight


def _is_library(row: dict) -> bool:
    return bool(names_matching([row], GEMM_KERNELS))


#: Actions that make cuDNN choose its convolution algorithm anew (layout, benchmarking, inductor's layout
#: optimization): vetoed on fp32 convolutions unless the tolerance allows TF32 rounding
#: (``evidence.fp32_convolutions``).
CONV_ALGORITHM_CHANGING = frozenset(
    {
        "torch_compile",
        "channels_last",
        "compile_max_autotune",
        "compile_cudagraphs",
        "compile_coordinate_descent",
        "cudnn_benchmark",
        "channels_last_compile",
    }
)


def vetoed(action: str, facts: Facts) -> str | None:
    """Why ``action`` is unsafe for the shown profile (None when it is allowed)."""
    if (
        facts.source == "ncu"
        and action in CONV_ALGORITHM_CHANGING
        and facts.v("fp32_conv")
        and not facts.tolerances.tf32
    ):
        return (
            f"{action} would let cuDNN pick another fp32 convolution algorithm (TF32 rounding, about 1e-3 "
            f"relative), which the tolerance {facts.tolerances.tolerance:g} does not allow"
        )
    return None
