"""A portable group source on ``torch.profiler``: runs on CPU and GPU, needs no counter permission.

The profiled program (``_program.py`` in ``torch`` mode) runs one forward call under ``torch.profiler``
(CPU activity, + CUDA on a GPU; ``record_shapes``, ``with_flops``, ``profile_memory``) and reports one
row per top-level operator name (calls, CPU and device time including children, FLOPs of the subtree),
the number of device kernels, the memory operators allocated, input/output/parameter bytes and the
median wall time of one un-profiled call. This module turns that into ``torch__*`` features. They never
reuse ncu names: a tree trained on torch features routes on torch features.

Operator time is device time on a GPU and CPU time on the CPU. Categories by operator name
(:func:`categorize`): ``matmul`` (mm, bmm, addmm, linear, conv*, einsum, attention, RNN/LSTM/GRU),
``reduction`` (sum, mean, softmax, norms, max/min, pooling, sort, losses, ...), ``copy`` (copy_, to, cat,
clone, contiguous, index, gather, embedding, views, ...), ``elementwise`` (other ``aten::`` operators:
add, mul, activations, ...), ``other`` (everything else).

Features: ``torch__{matmul,elementwise,reduction,copy,other}_time_share``, ``torch__top_op_time_share``,
``torch__op_count`` (top-level operator calls), ``torch__kernel_count`` (device kernels; 0 on CPU),
``torch__wall_time_us``, ``torch__op_time_us``, ``torch__mean_op_time_us``,
``torch__launch_overhead_share`` (``1 - op time / wall time of the profiled call``, clipped to [0, 1]:
Python, dispatch and launch overhead; both times from the same profiled call, so profiler overhead
largely cancels), ``torch__flop_count``, ``torch__achieved_flops_per_s`` (FLOPs / wall time),
``torch__arithmetic_intensity`` (FLOPs / (io + parameter bytes)), ``torch__memory_allocated_bytes``,
``torch__io_bytes``, ``torch__param_bytes``.

Example:
    >>> ops = [{"name": "aten::addmm", "count": 1, "cpu_us": 60.0, "device_us": 0.0, "flops": 2000},
    ...        {"name": "aten::relu", "count": 2, "cpu_us": 20.0, "device_us": 0.0, "flops": 0}]
    >>> result = {"wall_us": 100.0, "io_bytes": 800, "param_bytes": 200, "kernel_count": 0, "ops": ops}
    >>> features, rows = torch_features(result, device="cpu")
    >>> features["torch__matmul_time_share"], round(features["torch__launch_overhead_share"], 6)
    (0.75, 0.2)
    >>> features["torch__arithmetic_intensity"]
    2.0
"""

from __future__ import annotations

import re

from autoprofiler.profiling.groups import GROUPS, group_metrics
from autoprofiler.profiling.profile import TORCH_DURATION, Profile

CATEGORIES = ("matmul", "elementwise", "reduction", "copy", "other")
_PATTERNS = (
    (
        "matmul",
        r"(^|::)(_?(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|einsum|tensordot|dot|mv|addmv)|.*conv.*"
        r"|.*attention.*|.*flash.*|lstm.*|gru.*|rnn_.*|_thnn_fused_.*_cell)$",
    ),
    (
        "reduction",
        r"(^|::)(sum|mean|prod|max|min|amax|amin|argmax|argmin|cumsum|cumprod|var|std|var_mean|std_mean|norm"
        r"|linalg_vector_norm|frobenius_norm|logsumexp|any|all|_?softmax|_?log_softmax|.*_norm|native_.*_norm"
        r"|topk|sort|median|mode|kthvalue|nll_loss.*|cross_entropy.*|mse_loss|l1_loss|.*_loss|cosine_similarity"
        r"|.*pool.*|count_nonzero)$",
    ),
    (
        "copy",
        r"(^|::)(copy_|_?to_copy|to|clone|contiguous|cat|stack|_cat|index|index_select|gather|scatter.*"
        r"|pad|constant_pad_nd|reflection_pad.*|replication_pad.*|repeat|repeat_interleave|expand_as|flip|roll"
        r"|narrow_copy|masked_select|nonzero|empty.*|zeros.*|ones.*|full.*|fill_|zero_|new_.*|slice_scatter"
        r"|unfold|im2col|col2im|pixel_shuffle|pixel_unshuffle|upsample.*|_?unsafe_view|view|reshape|permute"
        r"|transpose|t|flatten|squeeze|unsqueeze|as_strided|expand|select|slice|split.*|chunk|unbind|detach|alias"
        r"|lift_fresh|resolve_conj|resolve_neg|_reshape_alias|embedding|_?embedding_bag|index_put_?|take"
        r"|one_hot)$",
    ),
)
_COMPILED = tuple((category, re.compile(pattern)) for category, pattern in _PATTERNS)
_ELEMENTWISE_NAMESPACES = ("aten::",)


def categorize(op_name: str) -> str:
    """Category of an operator name.

    >>> [categorize(n) for n in ("aten::addmm", "aten::conv2d", "aten::softmax", "aten::cat", "aten::gelu")]
    ['matmul', 'matmul', 'reduction', 'copy', 'elementwise']
    >>> categorize("MyOp")
    'other'
    """
    for category, pattern in _COMPILED:
        if pattern.search(op_name):
            return category
    return "elementwise" if op_name.startswith(_ELEMENTWISE_NAMESPACES) else "other"


def torch_features(result: dict, device: str) -> tuple[dict[str, float], list[dict]]:
    """``torch__*`` features and per-operator rows from one task's program result."""
    on_gpu = device.startswith("cuda")
    rows = []
    for op in result.get("ops", []):
        time_us = float(op["device_us"] if on_gpu else op["cpu_us"])
        rows.append(
            {
                "name": op["name"],
                TORCH_DURATION: time_us,
                "torch__count": float(op["count"]),
                "torch__flop_count": float(op.get("flops", 0)),
                "torch__category": categorize(op["name"]),
            }
        )
    op_time = sum(r[TORCH_DURATION] for r in rows)
    by_category = dict.fromkeys(CATEGORIES, 0.0)
    for row in rows:
        by_category[row["torch__category"]] += row[TORCH_DURATION]
    wall_us = float(result.get("wall_us", 0.0))
    profiled_wall_us = float(result.get("profiled_wall_us", wall_us))
    op_count = sum(r["torch__count"] for r in rows)
    flops = sum(r["torch__flop_count"] for r in rows)
    io_bytes = float(result.get("io_bytes", 0))
    param_bytes = float(result.get("param_bytes", 0))
    features = {
        f"torch__{c}_time_share": (by_category[c] / op_time if op_time > 0 else 0.0) for c in CATEGORIES
    }
    features.update(
        {
            "torch__top_op_time_share": max((r[TORCH_DURATION] for r in rows), default=0.0) / op_time
            if op_time > 0
            else 0.0,
            "torch__op_count": op_count,
            "torch__kernel_count": float(result.get("kernel_count", 0)),
            "torch__wall_time_us": wall_us,
            "torch__op_time_us": op_time,
            "torch__mean_op_time_us": op_time / op_count if op_count else 0.0,
            "torch__launch_overhead_share": (
                min(1.0, max(0.0, 1.0 - op_time / profiled_wall_us)) if profiled_wall_us > 0 else 0.0
            ),
            "torch__flop_count": flops,
            "torch__achieved_flops_per_s": flops / (wall_us * 1e-6) if wall_us > 0 else 0.0,
            "torch__arithmetic_intensity": flops / (io_bytes + param_bytes)
            if io_bytes + param_bytes > 0
            else 0.0,
            "torch__memory_allocated_bytes": float(result.get("memory_bytes", 0)),
            "torch__io_bytes": io_bytes,
            "torch__param_bytes": param_bytes,
        }
    )
    rows.sort(key=lambda r: (-r[TORCH_DURATION], r["name"]))
    return features, rows


TORCH_UNITS = {
    "torch__wall_time_us": "us",
    "torch__op_time_us": "us",
    "torch__mean_op_time_us": "us",
    TORCH_DURATION: "us",
    "torch__flop_count": "FLOP",
    "torch__achieved_flops_per_s": "FLOP/s",
    "torch__arithmetic_intensity": "FLOP/byte",
    "torch__memory_allocated_bytes": "byte",
    "torch__io_bytes": "byte",
    "torch__param_bytes": "byte",
    "torch__op_count": "op",
    "torch__kernel_count": "kernel",
}


def profile_from_torch_result(
    task_hash: str, result: dict, groups, *, device: str, device_name: str, seconds: float
) -> Profile:
    """A torch-source Profile holding only ``groups``' features."""
    features, rows = torch_features(result, device)
    groups = tuple(groups)
    for group in groups:
        if GROUPS[group].source != "torch":
            raise ValueError(f"group {group!r} is not a torch group")
    names = set(group_metrics(groups))
    return Profile(
        task_hash=task_hash,
        source="torch",
        groups=frozenset(groups),
        metrics={k: v for k, v in features.items() if k in names},
        kernels=rows,
        passes=0,
        seconds=seconds,
        device=device_name,
        units={k: v for k, v in TORCH_UNITS.items() if k in names or k == TORCH_DURATION},
    )
