"""One GpuWorker per GPU, on a Ray cluster of logical GPUs (CPU only): each worker its own GPU, timing
lock and memory ledger, no CPU held; and the multi-GPU bench's comparison of two runs' reward rows."""

from __future__ import annotations

import json
import math
import shutil
import socket
from pathlib import Path

import polars as pl
import pytest
from conftest import init_test_ray, load_script

from autoprofiler.provenance import physical_gpu, visible_gpu
from autoprofiler.runtime import CellWorker, WorkerSpec

ray = pytest.importorskip("ray")
from autoprofiler.runtime.ray_driver import RayDriver  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def two_gpu_ray():
    """A local Ray whose node claims 2 GPUs."""
    init_test_ray(2)
    yield
    ray.shutdown()


def test_physical_gpu_names_the_gpu_of_the_host_whichever_process_asks():
    assert physical_gpu("cuda", {"CUDA_VISIBLE_DEVICES": "3"}) == "gpu3"  # a Ray actor's only GPU
    assert physical_gpu("cuda:1", {"CUDA_VISIBLE_DEVICES": "2,5"}) == "gpu5"
    assert physical_gpu("cuda", {}) == physical_gpu("cuda:0", {}) == "gpu0"  # one GPU, two spellings
    assert physical_gpu("cuda:2", {"CUDA_VISIBLE_DEVICES": "0"}) == "gpu2"  # past the list: as given
    assert physical_gpu("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-8f2a/x"}) == "GPU-8f2a_x"  # a UUID, file-safe
    assert physical_gpu("cpu", {"CUDA_VISIBLE_DEVICES": "3"}) is None
    # nvidia-smi --id takes the entry itself (it numbers GPUs by the host, whatever the variable says)
    assert visible_gpu("cuda", {"CUDA_VISIBLE_DEVICES": "GPU-8f2a"}) == "GPU-8f2a"
    assert visible_gpu("cuda:1", {"CUDA_VISIBLE_DEVICES": "2,5"}) == "5"


def test_workers_on_two_gpus_time_at_once_and_workers_on_one_gpu_take_turns(monkeypatch):
    """The timing lock and the memory ledger are per physical GPU: workers on GPUs 0 and 1 each have
    their own (one shared file serialized every GPU's timing and pooled their memory plans), while a
    worker whose "cuda:1" is GPU 0 shares GPU 0's with a Ray actor's "cuda" there."""

    def host_files(device: str, visible: str) -> tuple[str, str]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        worker = CellWorker(WorkerSpec(device=device))
        try:
            return worker.evaluator.config.timing_lock, worker.evaluator.config.memory_ledger
        finally:
            worker.close()

    gpu0, gpu1 = host_files("cuda", "0"), host_files("cuda", "1")
    assert gpu0[0] != gpu1[0] and gpu0[1] != gpu1[1]
    assert host_files("cuda:1", "1,0") == gpu0
    assert all(path.endswith(("-gpu0.lock", "-gpu0.json")) for path in gpu0)


def test_one_gpu_worker_per_gpu_each_on_its_own_and_no_cpu_held(two_gpu_ray):
    """With no worker count, one GpuWorker per GPU of the cluster; Ray gives each its own GPU, its rows
    name it (``host:gpuN:pid``), and the workers hold no CPU: the driver's Ray tasks (its Ray Data table
    writes) still run on a 2-CPU machine, where a CPU held per worker left them none (an oracle sweep
    with two workers there waited for its first write for ever)."""
    driver = RayDriver.start(WorkerSpec(device="cuda"), progress=None)
    try:
        infos = driver.info()
        assert sorted(i["gpu"] for i in infos) == ["gpu0", "gpu1"]
        host = socket.gethostname()
        assert sorted(i["name"] for i in infos) == sorted(f"{host}:{i['gpu']}:{i['pid']}" for i in infos)
        assert ray.available_resources().get("GPU", 0) == 0
        assert ray.available_resources().get("CPU", 0) == 2
        assert ray.get(ray.remote(lambda: "ran").remote(), timeout=60) == "ran"
    finally:
        driver.close()
    driver = RayDriver.start(WorkerSpec(device="cpu"), num_workers=2, progress=None)  # CPU workers alike
    try:
        assert len(driver.info()) == 2 and ray.available_resources().get("CPU", 0) == 2
    finally:
        driver.close()
    with pytest.raises(RuntimeError, match="need 3 GPUs; the Ray cluster has 2"):
        RayDriver.start(WorkerSpec(device="cuda"), num_workers=3)


# --- bench/multigpu.py's comparison ---------------------------------------------------------------------
def _bench():
    return load_script(ROOT / "bench" / "multigpu.py", "multigpu_bench")


def _rows(cells: list[tuple[str, str, bool, str | None, float | None, float]]) -> pl.DataFrame:
    """Action rows from (task, action, correct, error kind, speedup, reference ms)."""
    return pl.DataFrame(
        {
            "key": [f"{t}/{a}" for t, a, *_ in cells],
            "task_id": [t for t, *_ in cells],
            "action": [a for _, a, *_ in cells],
            "correct": [c for _, _, c, *_ in cells],
            "error_kind": [e for *_, e, _, _ in cells],
            "speedup": [s for *_, s, _ in cells],
            "ref_ms": [r for *_, r in cells],
            "effective_speedup": [s if c else 1.0 for _, _, c, _, s, _ in cells],
        }
    )


BASE = [
    ("t1", "keep", True, None, 1.0, 10.0),
    ("t1", "torch_compile", True, None, 2.0, 10.0),
    ("t2", "keep", True, None, 1.0, 5.0),
    ("t2", "tf32", False, "wrong_output", None, 5.0),
    ("t3", "keep", True, None, 1.0, 2.0),
    ("t3", "cuda_graph", True, None, 1.5, 2.0),
]


def test_a_run_compared_with_itself_agrees_everywhere():
    a = _bench().agreement(_rows(BASE), _rows(BASE))
    assert (a["cells"], a["outcome_agree"], a["tasks"], a["best_exact"], a["best_agree"]) == (6, 6, 3, 3, 3)
    assert a["speedup_drift"]["max"] == 0 and a["reference_drift"]["p90"] == 0 and a["tolerance"] == 0.05
    assert a["oracle_base"] == a["oracle_other"] == pytest.approx(math.exp(math.log(3.0) / 3))


def test_outcome_flips_and_a_best_action_lost_beyond_the_noise_are_counted():
    other = list(BASE)
    other[3] = ("t2", "tf32", False, "runtime_error", None, 5.0)  # another failure kind
    other[1] = ("t1", "torch_compile", True, None, 0.9, 10.2)  # t1's best is now keep, far beyond the noise
    other[5] = ("t3", "cuda_graph", True, None, 1.52, 2.0)  # within the noise
    a = _bench().agreement(_rows(BASE), _rows(other))
    assert a["outcome_agree"] == 5
    assert a["best_agree"] == a["best_exact"] == 2  # t2 and t3
    assert a["reference_drift"]["max"] == pytest.approx(0.02)
    assert a["tolerance"] == pytest.approx(0.05)  # twice the reference's p90 (2%) is under the 5% floor
    assert a["speedup_drift"]["max"] == pytest.approx(2.0 / 0.9 - 1)

    # a near-tie that flips (torch_compile 2% ahead, then 1% behind keep) is no exact match, yet agrees
    def with_compile(speedup):
        return [(t, a, ok, k, speedup if a == "torch_compile" else s, ms) for t, a, ok, k, s, ms in BASE]

    a = _bench().agreement(_rows(with_compile(1.02)), _rows(with_compile(0.99)))
    assert (a["best_exact"], a["best_agree"]) == (2, 3)
    # only the cells in both runs are compared
    assert _bench().agreement(_rows(BASE), _rows(other[:4]))["cells"] == 4


def test_the_page_compares_every_setting_with_a_recording(tmp_path, capsys):
    """``--table --agree-with``: each setting's rows against a recording's rows of the same cells. With
    the one-worker run itself as the recording, its own agreement is total and the two-worker run's
    equals its agreement with the first setting; a folder without a reward table is a one-line error."""
    runs = tmp_path / "m_runs"
    shutil.copytree(ROOT / "bench" / "results" / "multigpu_cpu_runs", runs)
    bench = _bench()
    assert (
        bench.main(
            ["--table", "--workers", "1,2", "--agree-with", str(runs / "w1"), "--out", str(tmp_path / "m")]
        )
        == 0
    )
    results = json.loads((tmp_path / "m.json").read_text())["results"]
    one, two = results
    assert one["agreement_recording"]["outcome_agree"] == one["agreement_recording"]["cells"] == one["cells"]
    assert one["agreement_recording"]["speedup_drift"]["max"] == 0
    assert two["agreement_recording"] == two["agreement"]
    assert "Agreement with the recording" in (tmp_path / "m.md").read_text()
    with pytest.raises(SystemExit) as stop:
        bench.main(["--table", "--agree-with", str(tmp_path), "--out", str(tmp_path / "n")])
    assert stop.value.code == 2 and "--agree-with: expected a recording" in capsys.readouterr().err
