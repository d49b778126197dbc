"""Profile: metric values for one task, per kernel and aggregated; derived features; prompt text.

Aggregation across a task's kernels (:func:`aggregate`), decided by the metric name's suffix:

* a name whose rollup is ``.sum`` with nothing after it (``dram__bytes_read.sum``,
  ``gpu__time_duration.sum``, ``sm__sass_thread_inst_executed_op_ffma_pred_on.sum``) is a count, bytes
  or a duration: the task value is the **sum** over kernels;
* everything else (``.avg``, ``.max``, ``.min``, ``.pct``, ``.ratio``, ``.pct_of_peak_*``,
  ``.per_second``, ``.per_cycle_*``, ``.sum.pct_of_peak_*`` and ``launch__*`` columns) is a rate,
  percentage, ratio or launch attribute: the task value is the **mean weighted by kernel duration**
  (``gpu__time_duration.sum``), over the kernels that report a value (plain mean if all durations are 0).

Derived features (``derived__*``, computed per collection run from that run's kernels):

* ``derived__kernel_count``: kernels in the task's range;
* ``derived__launch_overhead_share``: ``1 - kernel time / wall time of one call`` (clipped to [0, 1]);
  the wall time is the median of a few synchronized calls in the profiled process, outside the NVTX
  range, so ncu's launch interception inflates it a little (an upper bound of the share);
* ``derived__flop_count``: ``fadd + fmul + 2 ffma + dadd + dmul + 2 dfma + 2 hadd + 2 hmul + 4 hfma``
  (thread instructions; half precision counted as ncu's roofline does, packed ``x2``/``x4``) plus
  ``derived__tensor_flop_count`` (``sm__ops_path_tensor_op_*`` ops) when collected;
* ``derived__achieved_flops_per_s``: FLOPs / kernel seconds; ``derived__arithmetic_intensity``: FLOPs /
  DRAM bytes (read + write);
* ``derived__tensor_core_time_share``: share of kernel time in kernels with gmma instructions or tensor
  ops (not hmma pipe cycles: see the hmma trap in ``docs/metric_groups.md``);
* ``derived__global_load_sectors_per_request`` / ``..._store_...``: sectors / requests (4 is coalesced
  fp32, 32 is fully scattered).

Example:
    >>> sm = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
    >>> kernels = [{"name": "a", "gpu__time_duration.sum": 300.0, sm: 10.0},
    ...            {"name": "b", "gpu__time_duration.sum": 100.0, sm: 50.0}]
    >>> aggregate(kernels, ["gpu__time_duration.sum", sm])
    {'gpu__time_duration.sum': 400.0, 'sm__throughput.avg.pct_of_peak_sustained_elapsed': 20.0}
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from autoprofiler.profiling.groups import (
    DURATION_METRIC,
    FLOP_METRICS,
    GROUPS,
    TENSOR_OPS_METRICS,
    group_metrics,
)
from autoprofiler.text import clip

log = logging.getLogger(__name__)

TORCH_DURATION = "torch__self_time_us"  # per-operator row duration for the torch source
_FLOP_WEIGHTS = {
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 1,
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": 1,
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": 2,
    "sm__sass_thread_inst_executed_op_dadd_pred_on.sum": 1,
    "sm__sass_thread_inst_executed_op_dmul_pred_on.sum": 1,
    "sm__sass_thread_inst_executed_op_dfma_pred_on.sum": 2,
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum": 2,
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum": 2,
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum": 4,
}
assert set(_FLOP_WEIGHTS) == set(FLOP_METRICS)
GMMA_METRIC = "sm__inst_executed_pipe_tensor_op_gmma.sum"
DERIVED_UNITS = {
    "derived__kernel_count": "kernel",
    "derived__launch_overhead_share": "fraction",
    "derived__flop_count": "FLOP",
    "derived__tensor_flop_count": "FLOP",
    "derived__achieved_flops_per_s": "FLOP/s",
    "derived__arithmetic_intensity": "FLOP/byte",
    "derived__tensor_core_time_share": "fraction",
    "derived__global_load_sectors_per_request": "sector/request",
    "derived__global_store_sectors_per_request": "sector/request",
}


_WARNED_KERNEL_LISTS: set[str] = set()


@dataclass
class Profile:
    """Metric values for one task.

    Attributes:
        task_hash: the task's content hash.
        source: ``"ncu"`` or ``"torch"``.
        groups: the groups collected; ``metrics`` holds exactly those groups' names that were measured.
        metrics: task-level values, names verbatim (ncu or ``torch__*``), derived ``derived__*``.
        kernels: per-kernel rows (ncu: ``{"name", "id", "gpu__time_duration.sum" (ns), metric: value}``;
            torch: per operator ``{"name", "torch__self_time_us", "torch__count", "torch__flop_count",
            "torch__category"}``), in launch order.
        passes: replay passes spent by the call that returned this profile (0 for torch / cache hits).
        seconds: wall seconds spent by that call.
        device: ``"NVIDIA H200"``, ``"cpu"``, ...
        units: name -> unit as ncu prints it in base units (``"%"``, ``"byte"``, ``"ns"``, ...).
    """

    task_hash: str
    source: str
    groups: frozenset[str]
    metrics: dict[str, float]
    kernels: list[dict] = field(default_factory=list)
    passes: int = 0
    seconds: float = 0.0
    device: str = ""
    units: dict[str, str] = field(default_factory=dict)

    def restrict(self, groups: Iterable[str]) -> Profile:
        """Only these groups' metrics (task level and kernel columns); groups not collected are dropped.

        >>> metrics = {"dram__bytes_read.sum": 1.0, "gpu__time_duration.sum": 5.0}
        >>> p = Profile("h", "ncu", frozenset({"root", "memory"}), metrics)
        >>> p.restrict(["memory"]).metrics
        {'dram__bytes_read.sum': 1.0}
        """
        keep_groups = frozenset(g for g in groups if g in self.groups)
        names = set(group_metrics(sorted(keep_groups, key=_catalog_order)))
        duration = TORCH_DURATION if self.source == "torch" else DURATION_METRIC
        row_keys = names | {"name", "id", duration, "torch__count", "torch__category"}
        return replace(
            self,
            groups=keep_groups,
            metrics={k: v for k, v in self.metrics.items() if k in names},
            kernels=[{k: v for k, v in row.items() if k in row_keys} for row in self.kernels],
            units={k: v for k, v in self.units.items() if k in names or k == duration},
        )

    def merge(self, other: Profile) -> Profile:
        """Union of two profiles of the same task and source; on a name in both, ``self`` wins.

        Kernel rows merge by position when both runs saw the same kernels (names in order); otherwise
        ``self``'s rows are kept and the other's columns dropped (logged). Cost: the sum of both.
        """
        if other.task_hash != self.task_hash or other.source != self.source:
            raise ValueError(
                f"cannot merge profiles of ({other.task_hash!r}, {other.source!r}) into "
                f"({self.task_hash!r}, {self.source!r}): expected the same task and source"
            )
        if not self.kernels:
            kernels = [dict(r) for r in other.kernels]
        elif not other.kernels or [r.get("name") for r in self.kernels] == [
            r.get("name") for r in other.kernels
        ]:
            kernels = [
                {**o, **s}
                for s, o in zip(self.kernels, other.kernels or [{}] * len(self.kernels), strict=True)
            ]
        else:
            if self.task_hash not in _WARNED_KERNEL_LISTS:  # once per task: replays merge often
                _WARNED_KERNEL_LISTS.add(self.task_hash)
                # metrics are unaffected, only the per-kernel table: not worth a warning. torch.profiler's
                # operator lists differ between runs that record different things (memory, shapes)
                what = "operator" if self.source == "torch" else "kernel (e.g. cuDNN chose other kernels)"
                log.info(
                    "task %s: %s lists differ between runs; keeping the first run's table",
                    self.task_hash,
                    what,
                )
            kernels = [dict(r) for r in self.kernels]
        return Profile(
            task_hash=self.task_hash,
            source=self.source,
            groups=self.groups | other.groups,
            metrics={**other.metrics, **self.metrics},
            kernels=kernels,
            passes=self.passes + other.passes,
            seconds=self.seconds + other.seconds,
            device=self.device or other.device,
            units={**other.units, **self.units},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_hash": self.task_hash,
            "source": self.source,
            "groups": sorted(self.groups),
            "metrics": dict(self.metrics),
            "kernels": [dict(r) for r in self.kernels],
            "passes": self.passes,
            "seconds": self.seconds,
            "device": self.device,
            "units": dict(self.units),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        return cls(
            task_hash=data["task_hash"],
            source=data["source"],
            groups=frozenset(data["groups"]),
            metrics={k: float(v) for k, v in data["metrics"].items()},
            kernels=list(data.get("kernels", [])),
            passes=int(data.get("passes", 0)),
            seconds=float(data.get("seconds", 0.0)),
            device=data.get("device", ""),
            units=dict(data.get("units", {})),
        )


def _catalog_order(group: str) -> int:
    names = list(GROUPS)
    return names.index(group) if group in names else len(names)


def is_summed(metric: str) -> bool:
    """True when the task value is the sum over kernels (rollup ``.sum`` and nothing after it).

    >>> [is_summed(m) for m in ("dram__bytes.sum", "dram__bytes.sum.per_second", "launch__grid_size")]
    [True, False, False]
    """
    return metric.endswith(".sum")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def aggregate(
    kernels: list[dict], metrics: Iterable[str], duration_key: str = DURATION_METRIC
) -> dict[str, float]:
    """Task-level values from per-kernel rows (rule in the module docstring); unmeasured names left out."""
    out: dict[str, float] = {}
    for metric in metrics:
        pairs = [
            (v, _number(k.get(duration_key)) or 0.0)
            for k in kernels
            if (v := _number(k.get(metric))) is not None
        ]
        if not pairs:
            continue
        if is_summed(metric):
            out[metric] = sum(v for v, _ in pairs)
        else:
            total = sum(w for _, w in pairs)
            out[metric] = (
                sum(v * w for v, w in pairs) / total if total > 0 else sum(v for v, _ in pairs) / len(pairs)
            )
    return out


def derive(metrics: dict[str, float], kernels: list[dict], wall_us: float | None = None) -> dict[str, float]:
    """Derived features from task-level metrics, the kernel rows and the wall time of one call."""
    out: dict[str, float] = {"derived__kernel_count": float(len(kernels))}
    kernel_ns = sum(_number(k.get(DURATION_METRIC)) or 0.0 for k in kernels)
    if wall_us and wall_us > 0:
        out["derived__launch_overhead_share"] = min(1.0, max(0.0, 1.0 - (kernel_ns / 1e3) / wall_us))
    tensor_present = [m for m in TENSOR_OPS_METRICS if m in metrics]
    if tensor_present:
        out["derived__tensor_flop_count"] = sum(metrics[m] for m in tensor_present)
    if all(m in metrics for m in FLOP_METRICS):
        flops = sum(_FLOP_WEIGHTS[m] * metrics[m] for m in FLOP_METRICS) + out.get(
            "derived__tensor_flop_count", 0.0
        )
        out["derived__flop_count"] = flops
        if kernel_ns > 0:
            out["derived__achieved_flops_per_s"] = flops / (kernel_ns * 1e-9)
        dram = metrics.get("dram__bytes_read.sum", 0.0) + metrics.get("dram__bytes_write.sum", 0.0)
        if "dram__bytes_read.sum" in metrics and dram > 0:
            out["derived__arithmetic_intensity"] = flops / dram
    if GMMA_METRIC in metrics or tensor_present:

        def uses_tensor_cores(row: dict) -> bool:
            return any((_number(row.get(m)) or 0.0) > 0 for m in (GMMA_METRIC, *TENSOR_OPS_METRICS))

        tensor_ns = sum(_number(k.get(DURATION_METRIC)) or 0.0 for k in kernels if uses_tensor_cores(k))
        out["derived__tensor_core_time_share"] = tensor_ns / kernel_ns if kernel_ns > 0 else 0.0
    for op in ("ld", "st"):
        sectors = metrics.get(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum")
        requests = metrics.get(f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum")
        if sectors is not None and requests:
            kind = "load" if op == "ld" else "store"
            out[f"derived__global_{kind}_sectors_per_request"] = sectors / requests
    return out


def profile_from_kernels(
    task_hash: str,
    rows: list[dict],
    groups: Iterable[str],
    units: dict[str, str],
    *,
    wall_us: float | None,
    passes: int,
    seconds: float,
    device: str,
) -> Profile:
    """Build an ncu Profile from one run's kernel rows (as parsed by :func:`ncu.parse_ncu_csv`)."""
    groups = tuple(groups)
    names = group_metrics(groups)
    kernels = []
    for row in rows:
        kernel_id = _number(row.get("ID", row.get("id")))
        kernel = {
            "name": row.get("Kernel Name", row.get("name", "")),
            "id": int(kernel_id) if kernel_id is not None else None,
        }
        for name in (DURATION_METRIC, *names):
            if name in row and not name.startswith("derived__"):
                kernel[name] = row[name]
        kernels.append(kernel)
    measured = aggregate(kernels, [DURATION_METRIC, *(n for n in names if not n.startswith("derived__"))])
    derived = derive(measured, kernels, wall_us)
    wanted = set(names)
    metrics = {k: v for k, v in {**measured, **derived}.items() if k in wanted}
    unit_map = {n: units[n] for n in (DURATION_METRIC, *names) if n in units}
    unit_map.update({n: DERIVED_UNITS[n] for n in names if n in DERIVED_UNITS})
    return Profile(
        task_hash=task_hash,
        source="ncu",
        groups=frozenset(groups),
        metrics=metrics,
        kernels=kernels,
        passes=passes,
        seconds=seconds,
        device=device,
        units=unit_map,
    )


# --- rendering -------------------------------------------------------------------------------------
def format_value(value: float | None) -> str:
    """Deterministic, compact number formatting for prompts.

    >>> [format_value(v) for v in (2683360.0, 86.814, 0.5, 1.37e11, 0.00012, None)]
    ['2,683,360', '86.81', '0.50', '1.37e+11', '0.00012', 'n/a']
    """
    if value is None or not math.isfinite(value):
        return "n/a"
    magnitude = abs(value)
    if magnitude >= 1e9:
        return f"{value:.3g}"
    if value == int(value):
        return f"{int(value):,}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 0.01:
        return f"{value:.2f}"
    return f"{value:.2g}"


def render_profile(profile: Profile, groups: Iterable[str] | None = None, top_kernels: int = 5) -> str:
    """Compact, deterministic text of a profile for a prompt: selected groups only, units, top kernels.

    Groups come in catalog order; a metric the run could not measure shows ``n/a``. The header gives
    the source, device, kernel count and total kernel time; then one ``[group]`` block per group with
    ``name = value unit`` lines; then the ``top_kernels`` kernels (operators for torch) by time.
    """
    selected = sorted(
        profile.groups if groups is None else [g for g in groups if g in profile.groups], key=_catalog_order
    )
    shown = profile.restrict(selected)
    torch_source = profile.source == "torch"
    duration_key = TORCH_DURATION if torch_source else DURATION_METRIC
    to_us = 1.0 if torch_source else 1e-3
    times = [(_number(k.get(duration_key)) or 0.0) * to_us for k in profile.kernels]
    total_us = sum(times)
    what = "operators" if torch_source else "kernels"
    lines = [
        f"profile ({profile.source}, {profile.device or 'unknown device'}): {len(profile.kernels)} {what}, "
        f"{format_value(total_us)} us total"
    ]
    for group in selected:
        lines.append(f"[{group}]")
        for metric in GROUPS[group].metrics:
            value = shown.metrics.get(metric)
            unit = profile.units.get(metric, "")
            lines.append(
                f"  {metric} = {format_value(value)}{' ' + unit if unit and value is not None else ''}"
            )
    if top_kernels and profile.kernels:
        order = sorted(range(len(times)), key=lambda i: (-times[i], i))[:top_kernels]
        lines.append(f"top {what} by time:")
        for rank, i in enumerate(order, start=1):
            share = times[i] / total_us * 100 if total_us > 0 else 0.0
            name = clip(profile.kernels[i].get("name", ""), 90)
            lines.append(f"  {rank}. {share:5.1f}% {format_value(times[i]):>10} us  {name}")
    return "\n".join(lines) + "\n"
