"""Estimate each suite task's full-size forward time on an H200 from a roofline, without a GPU.

Run: python datasets/suite/_estimate_roofline.py [--size full]

Each task is built and run on the ``meta`` device (no memory, no compute): a dispatch mode records
every ATen op, counting FLOPs (``torch.utils.flop_counter``: GEMMs, convolutions), bytes (inputs +
outputs of every non-view op: the DRAM traffic of an unfused eager run) and kernel launches. The
estimate is ``max(FLOPs / peak, bytes / bandwidth) + launches * launch_cost``, with achievable H200
numbers (SXM: 67 TFLOP/s fp32 SIMT, 989 TFLOP/s dense bf16/fp16 tensor cores, 4.8 TB/s HBM3e,
derated to 70%/60%/85%) and 4 us per eager launch. A sizing check, not a measurement: the H200 run
(``_check_suite.py --device cuda``) is the truth.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

SUITE = Path(__file__).resolve().parent
PEAK_FLOPS = {"fp32": 67e12 * 0.7, "bf16": 989e12 * 0.6, "fp16": 989e12 * 0.6}
BANDWIDTH = 4.8e12 * 0.85
LAUNCH_S = 4e-6


def estimate(task):
    """(GFLOP, GB moved, launches, estimated ms, bound) for one task at the current size."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Traffic(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.launches = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._schema.name.startswith("aten::") and not func.is_view and "empty" not in func.__name__:
                tensors = [
                    a for a in torch.utils._pytree.tree_leaves((args, kwargs, out)) if torch.is_tensor(a)
                ]
                self.bytes += sum(t.numel() * t.element_size() for t in tensors)
                self.launches += 1
            return out

    module = types.ModuleType("task")
    exec(compile(task.source, task.origin, "exec"), module.__dict__)
    with torch.device("meta"):
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
    flops, traffic = FlopCounterMode(display=False), Traffic()
    with torch.no_grad(), flops, traffic:
        model(*inputs)
    dtype = next(tag for tag in task.tags if tag in PEAK_FLOPS)
    compute_s = flops.get_total_flops() / PEAK_FLOPS[dtype]
    memory_s = traffic.bytes / BANDWIDTH
    launch_s = traffic.launches * LAUNCH_S
    bound = max((compute_s, "compute"), (memory_s, "memory"), (launch_s, "latency"))[1]
    total_ms = (max(compute_s, memory_s) + launch_s) * 1e3
    return flops.get_total_flops() / 1e9, traffic.bytes / 1e9, traffic.launches, total_ms, bound


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("small", "full"), default="full")
    args = parser.parse_args(argv)
    os.environ["AUTOPROFILER_TASK_SIZE"] = args.size
    sys.path.insert(0, str(SUITE.parents[1]))
    from autoprofiler.tasks import load_task_folder

    print("| task | GFLOP | GB moved | launches | est. H200 ms | roofline bound | tagged |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    failures = 0
    for task in load_task_folder(SUITE):
        tagged = next((tag for tag in task.tags if tag.endswith("-bound")), "?")
        try:
            gflop, gb, launches, ms, bound = estimate(task)
        except Exception as error:  # a task the meta device cannot run: report and go on
            print(f"| {task.id} | - | - | - | - | {type(error).__name__}: {str(error)[:60]} | {tagged} |")
            failures += 1
            continue
        print(f"| {task.id} | {gflop:.1f} | {gb:.3f} | {launches} | {ms:.3f} | {bound} | {tagged} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
