"""The torch.profiler source on real suite tasks (CPU, size small), sequential semantics and the cache.

Each profiled process costs seconds (Python + torch start-up), so the module spends two: one batch of
the whole suite plus a broken task (all torch groups but torch_launch), then torch_launch for one task.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from autoprofiler.profiling import GROUPS, ProfileCache, Profiler, ProgramFailed, render_profile
from autoprofiler.profiling.torch_source import CATEGORIES, categorize
from autoprofiler.tasks import Task, load_task_file, load_task_folder

SUITE = Path(__file__).resolve().parents[1] / "datasets" / "suite"
TORCH_GROUPS = [name for name, group in GROUPS.items() if group.source == "torch"]
SUITE_TASKS = ["l1/relu", "l1/matmul_square", "l1/softmax_rows", "l1/transpose_copy", "l2/linear_gelu"]


def suite_task(name: str) -> Task:
    return load_task_file(SUITE / f"{name}.py", id=f"suite/{name}")


BROKEN = textwrap.dedent(
    """
    import torch
    class Model(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("this task is broken on purpose")
    def get_inputs():
        return [torch.randn(4)]
    def get_init_inputs():
        return []
    """
)
BATCH_GROUPS = [g for g in TORCH_GROUPS if g != "torch_launch"]  # torch_launch comes later, sequentially


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The whole suite (45 tasks) and a broken task, every torch group but torch_launch, one process."""
    cache_dir = tmp_path_factory.mktemp("torch_cache")
    profiler = Profiler(source="torch", device="cpu", cache=ProfileCache(cache_dir), task_size="small")
    suite = list(load_task_folder(SUITE))
    broken = Task.from_source("tests/broken", BROKEN)
    with pytest.raises(ProgramFailed, match="broken on purpose") as info:
        profiler.collect_many([suite[0], broken, *suite[1:]], BATCH_GROUPS)
    runs = list(profiler.runs)
    profiles = profiler.collect_many(suite, BATCH_GROUPS)  # served from memory: no new run
    assert len(profiler.runs) == 1
    return {
        "profiler": profiler,
        "cache_dir": cache_dir,
        "runs": runs,
        "error": info.value,
        "broken": broken,
        "suite": suite,
        "profiles": {t.id.removeprefix("suite/"): p for t, p in zip(suite, profiles, strict=True)},
    }


def test_batch_is_one_process(batch):
    """collect_many ran a single program for all suite tasks and all groups."""
    (run,) = batch["runs"]
    assert len(batch["suite"]) >= 40 and all(n in batch["profiles"] for n in SUITE_TASKS)
    assert len(run.task_hashes) == len(batch["suite"]) + 1 and run.groups == tuple(BATCH_GROUPS)
    for profile in batch["profiles"].values():
        assert profile.groups == set(BATCH_GROUPS) and profile.source == "torch" and profile.device == "cpu"
        assert profile.passes == 0 and profile.seconds == 0.0  # the second call spent nothing


def test_failed_task_caches_nothing_but_batch_mates_are_kept(batch):
    """The broken task raised ProgramFailed naming it; the good tasks of its batch were cached."""
    assert set(batch["error"].failures) == {batch["broken"].hash}
    reopened = ProfileCache(batch["cache_dir"])
    env = batch["profiler"].environment
    assert reopened.get(batch["broken"].hash, ["torch_root"], env) is None
    for task in batch["suite"]:
        assert reopened.get(task.hash, BATCH_GROUPS, env) is not None


def test_every_feature_is_finite_on_the_whole_suite(batch):
    """On every suite task: all features of the collected groups, finite, shares in [0, 1] summing to 1."""
    expected = {m for g in BATCH_GROUPS for m in GROUPS[g].metrics}
    for name, profile in batch["profiles"].items():
        assert set(profile.metrics) == expected, name
        assert all(math.isfinite(v) for v in profile.metrics.values()), name
        shares = [profile.metrics[f"torch__{c}_time_share"] for c in CATEGORIES]
        assert all(0.0 <= s <= 1.0 for s in shares) and sum(shares) == pytest.approx(1.0), name
        assert profile.metrics["torch__wall_time_us"] > 0 and profile.metrics["torch__op_count"] >= 1, name
        assert profile.metrics["torch__kernel_count"] == 0  # CPU: no device kernels


def test_features_match_the_programs(batch):
    """Categories, FLOPs and bytes agree with what the task sources do at size small."""
    profiles = batch["profiles"]
    matmul = profiles["l1/matmul_square"].metrics
    assert matmul["torch__matmul_time_share"] > 0.9
    assert matmul["torch__flop_count"] == 2 * 256**3
    assert matmul["torch__io_bytes"] == 3 * 256 * 256 * 4 and matmul["torch__param_bytes"] == 0
    relu = profiles["l1/relu"].metrics
    assert relu["torch__elementwise_time_share"] > 0.9 and relu["torch__flop_count"] == 0
    assert relu["torch__io_bytes"] == 2 * 1024 * 1024 * 4
    assert profiles["l1/softmax_rows"].metrics["torch__reduction_time_share"] > 0.9
    assert profiles["l1/transpose_copy"].metrics["torch__copy_time_share"] > 0.9
    linear = profiles["l2/linear_gelu"]
    assert linear.metrics["torch__flop_count"] == 2 * 128 * 256 * 512
    assert linear.metrics["torch__param_bytes"] == (256 * 512 + 512) * 4
    assert {k["name"] for k in linear.kernels} >= {"aten::linear", "aten::gelu"}
    assert render_profile(linear, ["torch_root"]).startswith("profile (torch, cpu): ")


def test_sequential_collection_and_cache(batch):
    """A superset collects only the new group; nothing is collected twice; the cache serves a new profiler."""
    profiler = batch["profiler"]
    task = suite_task("l2/linear_gelu")
    runs_before = len(profiler.runs)
    everything = profiler.collect(task, TORCH_GROUPS)
    assert [r.groups for r in profiler.runs[runs_before:]] == [("torch_launch",)]
    assert everything.groups == set(TORCH_GROUPS) and everything.seconds > 0
    assert 0.0 <= everything.metrics["torch__launch_overhead_share"] <= 1.0
    assert everything.metrics["torch__op_time_us"] > 0
    # Values collected earlier are kept, not overwritten by the later run.
    assert (
        everything.metrics["torch__wall_time_us"]
        == batch["profiles"]["l2/linear_gelu"].metrics["torch__wall_time_us"]
    )
    again = profiler.collect(task, ["torch_launch"])
    assert len(profiler.runs) == runs_before + 1 and again.seconds == 0.0 and again.passes == 0
    fresh = Profiler(source="torch", device="cpu", cache=ProfileCache(batch["cache_dir"]), task_size="small")
    cached = fresh.collect(task, list(reversed(TORCH_GROUPS)))
    assert fresh.runs == [] and cached.seconds == 0.0 and cached.passes == 0
    assert cached.metrics == everything.metrics
    assert [k["name"] for k in cached.kernels] == [k["name"] for k in everything.kernels]


def test_categorize():
    """Operator names map to the five categories."""
    assert categorize("aten::bmm") == "matmul" and categorize("aten::convolution") == "matmul"
    assert categorize("aten::layer_norm") == "reduction" and categorize("aten::max_pool2d") == "reduction"
    assert categorize("aten::contiguous") == "copy" and categorize("aten::index_select") == "copy"
    assert categorize("aten::sigmoid") == "elementwise" and categorize("prim::PythonOp") == "other"


def test_bad_arguments_are_rejected():
    """Source, device, size and group names are validated with the expected values in the message."""
    with pytest.raises(ValueError, match="expected one of"):
        Profiler(source="nsys")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Profiler(source="ncu", device="cpu")
    with pytest.raises(ValueError, match="task_size"):
        Profiler(source="torch", device="cpu", task_size="huge")
    with pytest.raises(KeyError, match="expected 'torch'"):
        Profiler(source="torch", device="cpu").collect(suite_task("l1/relu"), ["memory"])
