"""Shared pytest setup: the ``gpu`` marker skip and tiny task fixtures.

- Tests marked ``@pytest.mark.gpu`` are skipped where ``torch.cuda.is_available()`` is false (torch is
  imported only when such a test was collected, so CPU-only test files stay fast to collect).
- ``tiny_task``: a 16x32 @ 32x32 matmul with a seeded weight (``tests/fault_corpus/tasks/matmul.py``);
  ``tiny_tasks``: every task under ``tests/fault_corpus/tasks/`` by file stem. Each runs in
  milliseconds on a CPU.
- ``load_script(path)``: a file outside any package (a ``bench/`` or ``workflows/`` script, a fixture)
  imported as a module.
- ``load_replay_fixture()``: the module ``tests/fixtures/replay/make_fixture.py`` (the replay fixture's
  tasks and tables); ``FakeProfile``: a stand-in for ``profiling.Profile`` for tests of routing.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
TINY_TASK_DIR = TESTS_DIR / "fault_corpus" / "tasks"
REPLAY_FIXTURE = TESTS_DIR / "fixtures" / "replay"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


def init_test_ray(num_gpus: int = 0) -> None:
    """A local Ray for one test module: 2 CPUs (the CI machine's), ``num_gpus`` logical GPUs (Ray
    schedules them as real ones), no dashboard, no worker logs, a small object store."""
    import ray

    ray.init(
        num_cpus=2,
        num_gpus=num_gpus,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=200 * 2**20,
    )


def load_tiny_task(name: str):
    """The tiny test task ``tests/fault_corpus/tasks/<name>.py`` as a ``Task`` (id ``tests/<name>``)."""
    from autoprofiler.tasks import Task

    path = TINY_TASK_DIR / f"{name}.py"
    return Task.from_source(f"tests/{name}", path.read_text(), level=1, origin=str(path))


@pytest.fixture
def tiny_task():
    """A tiny matmul task (KernelBench form, ``Model(32)``, input ``randn(16, 32)``)."""
    return load_tiny_task("matmul")


@pytest.fixture(scope="session")
def tiny_tasks() -> dict:
    """Every tiny test task by file stem: ``matmul``, ``tiny_softmax``, ``slow_repeat``, ..."""
    return {p.stem: load_tiny_task(p.stem) for p in sorted(TINY_TASK_DIR.glob("*.py"))}


def load_script(path: Path, name: str | None = None, *, register: bool = False):
    """Import ``path``, a file outside any package, as a module named ``name`` (default: the file's stem).

    ``register`` puts the module in ``sys.modules`` before running it, which a script whose dataclasses
    look their module up there needs; left off, what the script defines pickles by value (Ray workers
    cannot import such a module by name).
    """
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_replay_fixture():
    """The module ``tests/fixtures/replay/make_fixture.py`` (``fixture_tasks()`` and the table writer)."""
    return load_script(REPLAY_FIXTURE / "make_fixture.py")


@dataclass
class FakeProfile:
    """Stand-in for profiling.Profile: metrics of the groups collected, with the cost of this call.

    ``features`` maps each group to its metric names (what ``restrict`` keeps); it is not compared.
    """

    groups: frozenset
    metrics: dict
    passes: int
    seconds: float
    features: dict = field(default_factory=dict, repr=False, compare=False)

    def merge(self, other):
        return FakeProfile(
            self.groups | other.groups, {**self.metrics, **other.metrics},
            self.passes + other.passes, self.seconds + other.seconds, self.features,
        )  # fmt: skip

    def restrict(self, groups):
        keep = {m for g in groups for m in self.features[g]}
        return FakeProfile(
            frozenset(groups) & self.groups, {k: v for k, v in self.metrics.items() if k in keep}, 0, 0.0,
            self.features,
        )  # fmt: skip
