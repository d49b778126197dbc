"""The profiled program's build step (``autoprofiler.profiling._program``), run in this process on CPU."""

from __future__ import annotations

import torch

from autoprofiler.profiling import _program

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return self.lin(x).relu()

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return [8]
"""

# A task whose input function cannot run under a ``torch.device`` context (it insists on the host).
HOST_ONLY = TASK.replace(
    "    return [torch.randn(4, 8)]",
    "    if torch.overrides._get_current_function_mode_stack():\n"
    "        raise RuntimeError('made on the host only')\n"
    "    return [torch.randn(4, 8)]",
)


def run(tmp_path, source: str, build_on_device: bool) -> dict:
    (tmp_path / "t.py").write_text(source)
    job = {"mode": "torch", "device": "cpu", "seed": 3, "build_on_device": build_on_device}
    return _program.run_task({"id": "t", "path": "t.py"}, job, tmp_path)


def test_a_build_under_the_device_context_gives_the_host_build_on_cpu(tmp_path):
    device, host = run(tmp_path, TASK, True), run(tmp_path, TASK, False)
    assert (device["built_on"], host["built_on"]) == ("device", "host")
    assert device["ok"] and host["ok"]
    assert device["io_bytes"] == host["io_bytes"] == (4 * 8 + 4 * 8) * 4
    assert device["param_bytes"] == host["param_bytes"] == (8 * 8 + 8) * 4


def test_a_task_that_cannot_build_on_the_device_is_built_on_the_host(tmp_path):
    out = run(tmp_path, HOST_ONLY, True)
    assert out["ok"] and out["built_on"] == "host"


def test_the_build_is_seeded_the_same_either_way(tmp_path):
    (tmp_path / "t.py").write_text(TASK)
    module = _program._load_module(tmp_path / "t.py", "autoprofiler_task_seeded")
    a_model, a_inputs = _program._build(module, "cpu", 3, True)
    b_model, b_inputs = _program._build(module, "cpu", 3, False)
    assert torch.equal(a_inputs[0], b_inputs[0])
    assert torch.equal(a_model.lin.weight, b_model.lin.weight)
    assert _program._tensor_bytes(a_inputs) == 128
