"""GPU tests of the sandboxed evaluator (marked ``gpu``: skipped where torch sees no CUDA device).

Run on the H200 (``bench/h200_eval_hardening.sh`` does; writes the measured numbers to
``$AUTOPROFILER_BENCH_OUT/eval_gpu_tests.json`` when that variable is set):

    AUTOPROFILER_BENCH_OUT=bench/results python -m pytest tests/test_evaluation_gpu.py -v -m gpu

Checks: CUDA timing of identity candidates is ~1.0 across the two processes; a ``load_inline`` CUDA
kernel builds (in the candidate's own ``TORCH_EXTENSIONS_DIR``) and is correct; an illegal memory access
is ``crashed`` (or ``runtime_error``) and the next evaluation still succeeds; the side-stream hack is
correct but not faster; every CPU fault-corpus case, the issue-13 attacks included, is classified the
same on CUDA; a torch.compile candidate is correct, not flagged; the candidate's host memory limit
(``RLIMIT_DATA``) holds where the driver allows it.
Imports only pytest, torch and the evaluation package (the H200 image has no ray or polars).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import load_tiny_task

from autoprofiler.evaluation import EvalConfig, Evaluator, identity_candidate

pytestmark = pytest.mark.gpu

CORPUS_DIR = Path(__file__).resolve().parent / "fault_corpus"
GPU = EvalConfig(device="cuda", task_size="full", timing_trials=100, warmup=10, timeout_s=300.0)
MEASURED: dict = {}


def read_case(path: Path) -> dict:
    """The ``# key: value`` header of a corpus file (as ``tests/test_evaluation.py`` reads it)."""
    header = {"config": {}, "device": "cpu"}
    for line in path.read_text().splitlines():
        m = re.match(r"#\s*(expect|task|config|device|message|message_cuda):\s*(.+)$", line)
        if m:
            header[m.group(1)] = json.loads(m.group(2)) if m.group(1) == "config" else m.group(2).strip()
    return header


CASES = {p.name: read_case(p) for p in sorted(CORPUS_DIR.glob("*.py"))}


@pytest.fixture(scope="module")
def gpu_evaluator():
    with Evaluator(GPU, spares=2) as ev:
        yield ev
    _save_measured()


def _save_measured() -> None:
    """Write what was measured so far (after every test: a run cut off by a time limit keeps it)."""
    out = os.environ.get("AUTOPROFILER_BENCH_OUT")
    if out and MEASURED:
        import torch

        MEASURED["_device"] = torch.cuda.get_device_name(0)
        MEASURED["_torch"] = torch.__version__
        path = Path(out) / "eval_gpu_tests.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(MEASURED, indent=2, sort_keys=True, default=str) + "\n")


def _record(name: str, result) -> None:
    MEASURED[name] = {
        k: getattr(result, k)
        for k in (
            "correct",
            "error_kind",
            "ref_ms",
            "new_ms",
            "ref_iqr_ms",
            "new_iqr_ms",
            "speedup",
            "wall_s",
        )
    }
    MEASURED[name]["error"] = result.error[:300]
    MEASURED[name]["details"] = {
        k: result.details.get(k)
        for k in (
            "witness",
            "memo",
            "spread",
            "timed_twice",
            "block_size",
            "candidate_worker",
            "phase_s",
            "candidate_trials_s",
            "candidate_pack_s",
            "unpack_outputs_s",
            "compare_s",
        )
    }
    _save_measured()


def _identity_ok(ev, task_name: str = "relu_cuda"):
    task = load_tiny_task(task_name)
    result = ev.evaluate(task, identity_candidate(task.source))
    assert result.correct, result.summary()
    return result


@pytest.mark.parametrize("task_name", ["relu_cuda", "matmul_cuda", "matmul_big"])
def test_cuda_identity_speedup_is_one(gpu_evaluator, task_name):
    """CUDA-event timing of ModelNew = Model in two processes gives a speedup within 1.00 +/- 0.05."""
    result = _identity_ok(gpu_evaluator, task_name)
    _record(f"identity/{task_name}", result)
    assert result.details["device_name"]
    assert result.details["timing_inputs"].startswith("made from seeds")
    assert 0.95 <= result.speedup <= 1.05, result.summary()


def test_load_inline_kernel_is_correct(gpu_evaluator):
    """A load_inline ReLU kernel compiles in the sandbox and matches torch.relu."""
    task = load_tiny_task("relu_cuda")
    result = gpu_evaluator.evaluate(task, (CORPUS_DIR / "load_inline_relu.py").read_text())
    _record("load_inline_relu", result)
    assert result.compiled and result.correct, result.summary()
    assert 0.3 < result.speedup < 3.0


COMPILED = """

class ModelNew(Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.compiled = torch.compile(super().forward)

    def forward(self, *args):
        return self.compiled(*args)
"""


def test_torch_compile_candidate_is_not_flagged(gpu_evaluator):
    """A torch.compile candidate compiles in its own process (TORCHINDUCTOR_COMPILE_THREADS=1): no pool
    of compile workers is busy in the quiet window before timing, so it is correct, not suspicious."""
    task = load_tiny_task("matmul_cuda")
    result = gpu_evaluator.evaluate(task, task.source + COMPILED)
    _record("torch_compile", result)
    assert result.correct and result.error_kind is None, result.summary()
    assert result.details.get("children_killed", 0) == 0


def test_illegal_memory_access_then_next_succeeds(gpu_evaluator):
    """An out-of-bounds load_inline kernel is crashed/runtime_error; the same Evaluator then works."""
    task = load_tiny_task("relu_cuda")
    result = gpu_evaluator.evaluate(task, (CORPUS_DIR / "illegal_memory_access.py").read_text())
    _record("illegal_memory_access", result)
    assert result.error_kind in ("crashed", "runtime_error"), result.summary()
    assert not result.correct
    _record("identity_after_illegal_access", _identity_ok(gpu_evaluator))


def test_side_stream_hack_is_not_faster(gpu_evaluator):
    """Side-stream work is waited for (outputs) and timed (device-wide sync before the end event)."""
    task = load_tiny_task("matmul_cuda")
    result = gpu_evaluator.evaluate(task, (CORPUS_DIR / "side_stream.py").read_text())
    _record("side_stream", result)
    assert result.correct, result.summary()
    assert result.speedup < 1.15, result.summary()


@pytest.mark.parametrize(
    "name",
    sorted(n for n, c in CASES.items() if c["device"] == "cpu" and "memory_limit_gb" not in c["config"]),
)
def test_fault_corpus_on_cuda(gpu_evaluator, name):
    """The CPU fault corpus (the issue-13 attacks included) classifies the same with tensors on the GPU."""
    case = CASES[name]
    task = load_tiny_task(case["task"])
    config = replace(GPU, timing_trials=20, **case["config"])
    result = gpu_evaluator.evaluate(task, (CORPUS_DIR / name).read_text(), config=config)
    _record(f"corpus/{name}", result)
    expected = case["expect"]
    if expected == "correct":
        assert result.correct, result.summary()
    else:
        assert result.error_kind == expected, result.summary()
        message = case.get("message_cuda", case.get("message", ""))
        assert message in result.error, result.error
    _identity_ok(gpu_evaluator, "matmul")


@pytest.mark.parametrize(
    "name", ["identity", "wrong_values.py", "stale_after_checks.py", "cached_output.py", "wrong_shape.py"]
)
@pytest.mark.parametrize("transport", ["channel", "memfd"])
def test_both_output_transports_classify_alike(gpu_evaluator, transport, name):
    """The CUDA default, the output channel (one memfd page-locked in both processes), and a sealed
    memfd per message classify the same: an identity candidate is correct at ~1.0x, and the corpus's
    wrong, stale, cached and misshapen outputs are flagged. The channel really is page-locked."""
    config = replace(GPU, output_transport=transport)
    if name == "identity":
        task = load_tiny_task("matmul_big")
        result = gpu_evaluator.evaluate(task, identity_candidate(task.source), config=config)
        _record(f"{transport}/identity", result)
        assert result.correct and 0.9 <= result.speedup <= 1.1, result.summary()
        if transport == "channel":
            assert result.details["output_channel"]["pinned"] is True, result.details.get("output_channel")
        return
    case = CASES[name]
    task = load_tiny_task(case["task"])
    result = gpu_evaluator.evaluate(
        task, (CORPUS_DIR / name).read_text(), config=replace(config, timing_trials=20, **case["config"])
    )
    _record(f"{transport}/{name}", result)
    expected = case["expect"]
    assert result.correct if expected == "correct" else result.error_kind == expected, result.summary()


def test_candidate_host_memory_limit_on_cuda():
    """RLIMIT_DATA of 2 GiB on a CUDA candidate: a 3 GiB host allocation is a MemoryError (skipped, with
    the reason, where the driver's own mappings do not work under it)."""
    config = replace(GPU, memory_limit_gb=2, timing_trials=20)
    task = load_tiny_task("matmul")
    with Evaluator(config, spares=0) as ev:
        result = ev.evaluate(task, (CORPUS_DIR / "memory_limit.py").read_text())
    limits = result.details.get("candidate_worker", {}).get("limits", "")
    MEASURED["memory_limit_cuda"] = {
        "limits": limits,
        "error_kind": result.error_kind,
        "error": result.error[:300],
    }
    _save_measured()
    if not limits.startswith("RLIMIT_DATA"):
        pytest.skip(f"no host memory limit on this CUDA driver: {limits}")
    assert result.error_kind == "runtime_error" and "MemoryError" in result.error, result.summary()
