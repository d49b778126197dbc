"""The Ray runtime on CPU: GpuWorker actors, the fan-out driver, a worker killed mid-sweep, replay actors."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
from conftest import REPLAY_FIXTURE, init_test_ray, load_replay_fixture, load_tiny_task

from autoprofiler.cells import Cell, CellFailure, RewardRow, WorkItem
from autoprofiler.environments import LiveEnvironment, ReplayEnvironment
from autoprofiler.rewriters.rule import RuleRewriter
from autoprofiler.runtime import CellWorker, LocalDriver, WorkerSpec
from autoprofiler.tables import part_files

ray = pytest.importorskip("ray")
from autoprofiler.runtime.ray_driver import RayDriver  # noqa: E402

ACTIONS = ("keep", "channels_last", "cuda_graph", "tf32")  # cheap on a CPU (no torch.compile)
SPEC = WorkerSpec(
    device="cpu",
    task_size="small",
    source="torch",
    eval={"timing_trials": 3, "warmup": 1, "correctness_trials": 1, "timeout_s": 120.0},
    concurrency=2,
)


@pytest.fixture(scope="module")
def local_ray():
    init_test_ray()
    yield
    ray.shutdown()


def action_items(tasks) -> list[WorkItem]:
    rule = RuleRewriter()
    return [
        WorkItem(Cell(t, (), rule.actions_identity, 0, 0, a, policy="action")) for t in tasks for a in ACTIONS
    ]


def test_ray_workers_give_the_rows_an_in_process_worker_gives(local_ray):
    """Two GpuWorker actors (no GPU) run a batch of action cells; every row matches its cell, and the
    candidates' correctness is what the same cells give in this process."""
    tasks = [load_tiny_task("matmul"), load_tiny_task("tiny_softmax")]
    items = action_items(tasks)
    # one cell per worker at a time: two workers with two cells each were four evaluations on the 2-CPU
    # CI machine, whose untimed steps shared the cores with the one being timed (a "suspicious" tf32 row)
    driver = RayDriver.start(replace(SPEC, concurrency=1), num_workers=2, progress=None)
    try:
        pids = {info["pid"] for info in driver.info()}
        rows = driver.run_cells(items)
    finally:
        driver.close()
    assert len(pids) == 2 and os.getpid() not in pids  # the actors are processes of their own
    assert all(isinstance(r, RewardRow) for r in rows), [r for r in rows if not isinstance(r, RewardRow)]
    assert [r.key for r in rows] == [i.cell.key for i in items]
    assert {r.worker.split(":")[1] for r in rows} <= {str(p) for p in pids}
    local = LocalDriver(CellWorker(SPEC)).run_cells(items)
    assert [(r.action, r.correct, r.error_kind) for r in rows] == [
        (r.action, r.correct, r.error_kind) for r in local
    ], [(r.action, r.error_kind, r.error[:300]) for r in [*rows, *local] if r.error_kind]


def test_a_worker_killed_mid_sweep_loses_no_row_and_writes_none_twice(local_ray, tmp_path):
    """The only worker is SIGKILLed while cells are in flight: Ray restarts it, the driver resubmits the
    lost cells, and the reward table holds every cell exactly once (also counted in the raw Parquet parts)."""
    tasks = [load_tiny_task("matmul"), load_tiny_task("tiny_softmax")]
    items = action_items(tasks)
    driver = RayDriver.start(SPEC, num_workers=1, progress=None)
    env = LiveEnvironment(rewriter=RuleRewriter(), table_dir=tmp_path, runner=driver, source="torch")
    first_pid = driver.info()[0]["pid"]
    killed = []

    def kill_after_two(result) -> None:
        if not killed and len(env.rewards) >= 1:  # one row stored, this is the second: kill mid-sweep
            os.kill(first_pid, signal.SIGKILL)
            killed.append(first_pid)

    try:
        env.runner.run_cells = _observing(driver.run_cells, kill_after_two)
        results = env.try_outcomes([i.cell for i in items])
        second_pid = driver.info()[0]["pid"]
    finally:
        env.close()
    assert killed and second_pid != first_pid and driver.lost_batches >= 1
    assert all(isinstance(r, RewardRow) for r in results), [r for r in results if isinstance(r, CellFailure)]
    raw = [
        k
        for part in part_files(tmp_path / "rewards")
        for k in pq.read_table(part, columns=["key"])["key"].to_pylist()
    ]
    assert sorted(raw) == sorted(i.cell.key for i in items)  # each cell once on disk: none lost, none twice


def test_fan_out_counts_a_loss_only_against_the_batch_that_was_running(local_ray, tmp_path):
    """A batch kills the only worker, whose restart takes 4 s: the driver pings it until it is back
    before submitting again, so the killer batch is charged one loss (not one per call made while the
    worker was still restarting) and then runs; every batch ends once."""
    from autoprofiler.runtime.driver import fan_out

    # defined here, so Ray ships the class by value (the test module is not importable in a worker)
    class SlowToRestart:
        """An actor whose batch containing "die" kills it (once), and whose restart takes ``restart_s``."""

        def __init__(self, marker: str, restart_s: float):
            import time

            if ray.get_runtime_context().was_current_actor_reconstructed:
                time.sleep(restart_s)  # a busy node: the restart re-runs a slow __init__
            self.marker = marker

        def info(self) -> int:
            return os.getpid()

        def run(self, batch: list[str]) -> list[str]:
            if "die" in batch and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)
            return [x.upper() for x in batch]

    actor = ray.remote(SlowToRestart).options(max_restarts=-1, max_task_retries=0, num_cpus=0)
    worker = actor.remote(str(tmp_path / "died"), 4.0)
    ray.get(worker.info.remote())
    done, losses = {}, []

    def lost(batch, error):
        losses.append(tuple(batch))
        return [batch] if losses.count(tuple(batch)) < 2 else []  # a second loss would give it up

    fan_out(
        [["a"], ["die"], ["b"]],
        lambda w, batch: worker.run.remote(batch),
        1,
        1,
        lambda batch, results: done.update(zip(batch, results, strict=True)),
        lost,
        ping=lambda w: worker.info.remote(),
    )
    assert losses == [("die",)], losses
    assert done == {"a": "A", "die": "DIE", "b": "B"}


def _observing(run_cells, observe):
    """``run_cells`` with ``observe(result)`` called before the environment stores each result."""

    def wrapped(items, deadline=None, on_result=None):
        def both(result):
            observe(result)
            if on_result is not None:
                on_result(result)

        return run_cells(items, deadline, on_result=both)

    return wrapped


def test_replay_actors_answer_as_the_in_process_replay(local_ray):
    """The replay environment through ReplayWorker actors gives the rows the in-process replay gives,
    for a rule rewriter (derived configuration rows) and for a recorded LLM rewriter's cells."""
    fx = load_replay_fixture()
    tasks = fx.fixture_tasks()
    configs = ["torch_memory+torch_root", "torch_launch+torch_root", "", "torch_flops+torch_ops"]
    local = ReplayEnvironment(REPLAY_FIXTURE, RuleRewriter(), "torch")
    remote = ReplayEnvironment(
        REPLAY_FIXTURE,
        RuleRewriter(),
        "torch",
        runner=RayDriver.start_replay(str(REPLAY_FIXTURE), "torch", 2),
    )
    try:
        cells = [local.cell(t, c) for t in tasks for c in configs]
        cells += [local.cell(t, "torch_memory+torch_root", "fixture-llm") for t in tasks]
        mine, theirs = local.try_outcomes(cells), remote.try_outcomes(cells)
    finally:
        remote.close()
    drop = ("created_at",)
    as_data = lambda r: (
        r.kind if isinstance(r, CellFailure) else {k: v for k, v in r.to_record().items() if k not in drop}
    )  # noqa: E731
    assert [as_data(r) for r in theirs] == [as_data(r) for r in mine]
    assert sum(isinstance(r, CellFailure) for r in mine) == len(tasks) // 2  # the unrecorded LLM cells


def test_cuda_workers_need_gpus_in_the_cluster(local_ray):
    """Asking for CUDA workers on a cluster without GPUs is a clear error, before any actor starts."""
    with pytest.raises(RuntimeError, match="need 2 GPUs; the Ray cluster has 0"):
        RayDriver.start(WorkerSpec(device="cuda"), num_workers=2)
