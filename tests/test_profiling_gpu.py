"""Nsight Compute on the H200: every group on suite tasks, batch vs per-task, sequential + cache.

Run on the GPU box (ncu on PATH, counters permitted):
    AUTOPROFILER_CAPTURE_DIR=tests/fixtures/ncu/h200 python -m pytest -q -m gpu tests/test_profiling_gpu.py
With ``AUTOPROFILER_CAPTURE_DIR`` set, every run's raw CSV, program result and the resulting profiles
(JSON) are written there, so they can be committed as parser fixtures.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from autoprofiler.profiling import GROUPS, ProfileCache, Profiler
from autoprofiler.profiling.groups import is_counter_metric
from autoprofiler.tasks import load_task_file

pytestmark = pytest.mark.gpu

SUITE = Path(__file__).resolve().parents[1] / "datasets" / "suite"
NCU_GROUPS = [name for name, group in GROUPS.items() if group.source == "ncu"]
TASKS = [
    "l1/relu",
    "l1/matmul_square",
    "l1/matmul_rect_bf16",
    "l1/gelu_bf16",
    "l1/softmax_rows",
    "l2/linear_gelu",
]
CAPTURE_DIR = os.environ.get("AUTOPROFILER_CAPTURE_DIR")


def suite_task(name: str):
    return load_task_file(SUITE / f"{name}.py", id=f"suite/{name}")


def make_profiler(**kwargs) -> Profiler:
    if shutil.which(kwargs.get("ncu_path", "ncu")) is None:
        pytest.skip("ncu is not on PATH")
    capture = Path(CAPTURE_DIR) if CAPTURE_DIR else None
    return Profiler(
        source="ncu", device="cuda", task_size="full", timeout_s=600, capture_dir=capture, **kwargs
    )


def save_profiles(name: str, profiles: dict) -> None:
    if CAPTURE_DIR:
        Path(CAPTURE_DIR).mkdir(parents=True, exist_ok=True)
        data = {task: p.to_dict() for task, p in profiles.items()}
        (Path(CAPTURE_DIR) / f"{name}.profiles.json").write_text(json.dumps(data, indent=1))


@pytest.fixture(scope="module")
def all_groups():
    """Every ncu group on six suite tasks, in one profiled process."""
    profiler = make_profiler()
    tasks = [suite_task(n) for n in TASKS]
    profiles = dict(zip(TASKS, profiler.collect_many(tasks, NCU_GROUPS), strict=True))
    save_profiles("all_groups", profiles)
    return profiler, profiles


def may_be_na(metric: str) -> bool:
    """Hit rates and per-instruction ratios have no value when their denominator is 0 (ncu prints n/a)."""
    return metric.endswith((".pct", ".ratio"))


@pytest.mark.parametrize("group", NCU_GROUPS)
def test_every_group_parses_to_finite_values(all_groups, group):
    """Each counter of the group has a finite value on every task (ratios where they apply); derived too."""
    _, profiles = all_groups
    for task, profile in profiles.items():
        assert profile.metrics["derived__kernel_count"] >= 1, task
        for metric in GROUPS[group].metrics:
            if (is_counter_metric(metric) or metric.startswith("launch__")) and not may_be_na(metric):
                assert metric in profile.metrics, f"{task}: {metric} missing"
            if metric in profile.metrics:
                assert math.isfinite(profile.metrics[metric]), f"{task}: {metric} = {profile.metrics[metric]}"
        present = [m for m in GROUPS[group].metrics if m in profile.metrics]
        assert len(present) >= 0.8 * len(GROUPS[group].metrics), f"{task}: only {present}"
        assert profile.passes > 0 and profile.seconds > 0


def test_kernels_and_cost_are_recorded(all_groups):
    """Per-kernel rows carry names and durations; derived features exist; passes come from ncu."""
    profiler, profiles = all_groups
    assert len(profiler.runs) == 1
    for task, profile in profiles.items():
        assert all(k["name"] and k["gpu__time_duration.sum"] > 0 for k in profile.kernels), task
        for feature in (
            "derived__launch_overhead_share",
            "derived__flop_count",
            "derived__tensor_core_time_share",
        ):
            assert feature in profile.metrics, f"{task}: {feature}"
        assert 0.0 <= profile.metrics["derived__launch_overhead_share"] <= 1.0


def test_measurements_match_the_programs(all_groups):
    """Physics sanity: relu is DRAM-bound, the fp32 GEMM SM-bound; bf16 GEMM on tensor cores, relu not."""
    _, p = all_groups
    sm, dram = (
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    )
    assert p["l1/relu"].metrics[dram] > 50 > p["l1/relu"].metrics[sm]
    assert p["l1/matmul_square"].metrics[sm] > p["l1/matmul_square"].metrics[dram]
    assert p["l1/matmul_rect_bf16"].metrics["derived__tensor_core_time_share"] > 0.5
    assert p["l1/relu"].metrics["derived__tensor_core_time_share"] == 0.0
    # The hmma trap: a bf16 elementwise kernel trips the hmma pipe counters but does no tensor-core work.
    gelu = p["l1/gelu_bf16"]
    tensor_columns = [{k: v for k, v in row.items() if "tensor" in k or k == "name"} for row in gelu.kernels]
    assert gelu.metrics["derived__tensor_core_time_share"] == 0.0, tensor_columns
    n = 4096  # matmul_square at size full: 2 n^3 FLOPs, fp32 FFMA (TF32 off by default)
    assert p["l1/matmul_square"].metrics["derived__flop_count"] == pytest.approx(2 * n**3, rel=0.05)


def _bare(kernel_name: str) -> str:
    """``void at::native::foo<4, T>(int)`` -> ``foo``."""
    head = re.split(r"[<(]", kernel_name.removeprefix("void "), maxsplit=1)[0]
    return head.rsplit("::", 1)[-1].strip()


def test_batch_matches_one_process_per_task():
    """The same kernels (names, count) per task whether tasks share a process or not; batch is cheaper."""
    names = ["l1/relu", "l2/linear_gelu"]
    tasks = [suite_task(n) for n in names]
    batch = make_profiler().collect_many(tasks, ["root"])
    single = [make_profiler().collect(t, ["root"]) for t in tasks]
    for b, s in zip(batch, single, strict=True):
        # ncu prints a kernel's demangled name with or without namespaces depending on the report
        # (seen on the H200: "void at::vectorized_elementwise_kernel<...>" in batch, "void
        # vectorized_elementwise_kernel<4, unnamed>..." alone): compare the bare function names.
        assert [_bare(k["name"]) for k in b.kernels] == [_bare(k["name"]) for k in s.kernels]
        assert b.metrics["gpu__time_duration.sum"] == pytest.approx(
            s.metrics["gpu__time_duration.sum"], rel=0.5
        )
    assert sum(p.seconds for p in batch) < sum(p.seconds for p in single)
    save_profiles("batch_vs_single", {f"batch:{n}": b for n, b in zip(names, batch, strict=True)})


def test_per_task_nvtx_filter_agrees():
    """The alternative filter (one --nvtx-include per task range) finds the same kernels per task."""
    tasks = [suite_task(n) for n in ("l1/relu", "l1/softmax_rows")]
    outer = make_profiler().collect_many(tasks, ["root"])
    per_task = make_profiler(nvtx_filter="per_task").collect_many(tasks, ["root"])
    for a, b in zip(outer, per_task, strict=True):
        assert [k["name"] for k in a.kernels] == [k["name"] for k in b.kernels]


def test_sequential_groups_and_cache(tmp_path):
    """root then root+stalls runs only stalls; a new profiler on the cache spawns nothing."""
    task = suite_task("l1/softmax_rows")
    profiler = make_profiler(cache=ProfileCache(tmp_path / "cache"))
    first = profiler.collect(task, ["root"])
    second = profiler.collect(task, ["root", "stalls"])
    assert [r.groups for r in profiler.runs] == [("root",), ("stalls",)]
    assert first.passes > 0 and second.passes > 0 and second.groups == {"root", "stalls"}
    fresh = make_profiler(cache=ProfileCache(tmp_path / "cache"))
    cached = fresh.collect(task, ["stalls", "root"])
    assert fresh.runs == [] and cached.passes == 0 and cached.seconds == 0.0
    assert cached.metrics == second.metrics


def test_torch_source_on_the_gpu():
    """The torch.profiler source with CUDA activity: device kernels counted, device time shares."""
    tasks = [suite_task(n) for n in ("l1/matmul_square", "l1/relu")]
    profiler = Profiler(source="torch", device="cuda", task_size="full", timeout_s=600)
    matmul, relu = profiler.collect_many(tasks, [g for g, grp in GROUPS.items() if grp.source == "torch"])
    assert matmul.metrics["torch__kernel_count"] >= 1 and relu.metrics["torch__kernel_count"] >= 1
    assert matmul.metrics["torch__matmul_time_share"] > 0.9
    assert relu.metrics["torch__elementwise_time_share"] > 0.9
    assert matmul.metrics["torch__flop_count"] == 2 * 4096**3
    assert all(math.isfinite(v) for p in (matmul, relu) for v in p.metrics.values())
    assert matmul.device.startswith("NVIDIA")
    save_profiles("torch_cuda", {"l1/matmul_square": matmul, "l1/relu": relu})


RANGE_RESULTS: dict = {}


@pytest.fixture(scope="module")
def range_profiler():
    """One profiler for the per-group range-replay tests (it carries what ncu refused between them)."""
    return make_profiler(range_replay_above=1)


def _save_range(profiler) -> None:
    """What was learned so far to ``$AUTOPROFILER_BENCH_OUT/range_unsupported.json`` (the format of
    ``autoprofiler/profiling/range_unsupported.json``), after every test: a cut-off run keeps it."""
    out = os.environ.get("AUTOPROFILER_BENCH_OUT")
    if not out:
        return
    from autoprofiler.profiling.groups import RANGE_UNSUPPORTED

    Path(out).mkdir(parents=True, exist_ok=True)
    data = {
        "unsupported": sorted(RANGE_UNSUPPORTED | profiler.range_dropped),
        "learned_now": sorted(profiler.range_dropped),
        "source": profiler.environment.tool,
        "device": profiler.environment.device,
        "groups": RANGE_RESULTS,
    }
    (Path(out) / "range_unsupported.json").write_text(json.dumps(data, indent=1) + "\n")


@pytest.mark.parametrize("group", [g for g in NCU_GROUPS if g != "root"])
def test_each_group_by_range_replay(range_profiler, group):
    """Each ncu group collects by range replay on a task of several kernels (l2/linear_gelu): the
    metrics ncu refuses over a range are dropped (and remembered), the rest are finite range values."""
    import time

    from autoprofiler.profiling.groups import ncu_request_metrics

    task = suite_task("l2/linear_gelu")
    start = time.monotonic()
    profile = range_profiler.collect(task, ["root", group])
    asked = [m for m in ncu_request_metrics([group]) if m != "gpu__time_duration.sum"]
    kept = [m for m in asked if m in profile.metrics]
    finite = [m for m in kept if math.isfinite(profile.metrics[m])]
    RANGE_RESULTS[group] = {
        "asked": len(asked),
        "kept": kept,
        "dropped": sorted(set(asked) - set(kept)),
        "finite": len(finite),
        "seconds": round(time.monotonic() - start, 1),
        "replay": [r.groups for r in range_profiler.runs][-1:],
    }
    _save_range(range_profiler)
    assert range_profiler.runs[-1].ok, range_profiler.runs[-1]
    assert finite, f"{group}: no finite metric by range replay ({RANGE_RESULTS[group]})"


def test_range_replay_on_a_task_with_many_kernels():
    """range_replay_above on the H200: rowwise_loop_normalize (about 1,280 launches per forward) gets its
    root by kernel replay, then every other group by range replay in one more process: finite range-level
    values, the root's kernel count, in minutes rather than the >9 minutes kernel replay took.
    """
    import time

    profiler = make_profiler(range_replay_above=64)
    task = suite_task("l2/rowwise_loop_normalize")
    start = time.monotonic()
    profile = profiler.collect(task, NCU_GROUPS)
    seconds = time.monotonic() - start
    print(f"rowwise_loop_normalize: {len(profile.kernels)} kernels, {profile.passes} passes, {seconds:.0f} s")
    assert [r.groups[0] for r in profiler.runs][:1] == ["root"] and len(profiler.runs) == 2
    assert profile.metrics["derived__kernel_count"] == len(profile.kernels) > 64
    for name in ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__waves_per_multiprocessor",
                 "smsp__average_warp_latency_per_inst_issued.ratio", "dram__bytes_read.sum"):  # fmt: skip
        assert math.isfinite(profile.metrics[name]), name
    save_profiles("range_replay", {"l2/rowwise_loop_normalize": profile})
