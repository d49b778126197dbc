"""The profiled program: runs tasks' forward calls for ncu (NVTX ranges) or torch.profiler.

Run as ``python -m autoprofiler.profiling._program JOB.json`` (the profiler writes the job and reads the
result back); it imports only the standard library and torch, so it runs on a GPU box without ray,
polars or openai. For each task, in order:

1. load the task source as a module, seed (``torch.manual_seed(seed)``), build ``Model(*get_init_inputs())``
   and the inputs from ``get_inputs()``: on a CUDA device under ``torch.device`` (``build_on_device``,
   the default there; a task whose build fails so is built on the host and moved);
2. warm up: ``warmup`` forward calls and a synchronize (JIT compilation and autotuning stay outside);
3. time ``timing_calls`` single forward calls, each synchronized, outside any range: the median is the
   wall time of one call (for the launch-overhead share);
4. ``mode == "ncu"``: free the caching allocator's idle blocks (``AUTOPROFILER_PROFILE_FREE_CACHE=0``:
   keep them), push range ``autoprofiler``, push ``ap:<task id>``, one forward, synchronize, pop, pop
   (ncu profiles the kernels inside ``autoprofiler/``);
   ``mode == "torch"``: one forward under ``torch.profiler`` (CPU, + CUDA activity on a GPU,
   ``record_shapes``, ``with_flops``, ``profile_memory``) and the per-operator rows.

Job (JSON): ``{"mode": "ncu"|"torch", "device": "cuda", "seed": 42, "warmup": 3, "timing_calls": 5,
"build_on_device": true,
"result": "result.json", "tasks": [{"id": "<hash>", "path": "tasks/<hash>.py"}]}``; relative paths are
relative to the job file. The result (JSON, rewritten after every task so a crash keeps what was done):
``{"torch": "2.11.0", "device_name": "NVIDIA H200", "tasks": {id: {"ok": bool, "error": str,
"wall_us": float, "io_bytes": int, "param_bytes": int, "built_on": "device"|"host", "ops": [...],
"kernel_count": int,
"memory_bytes": int, "profiled_wall_us": float}}}`` (the last four in torch mode).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

FREE_CACHE_ENV = "AUTOPROFILER_PROFILE_FREE_CACHE"  # "0": keep the allocator's cache before the ncu range


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _to_device(value, device):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value


def _tensor_bytes(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _profile_with_torch(model, inputs, device: str) -> dict:
    """One forward under torch.profiler; rows per top-level operator call, summed by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True, with_flops=True, profile_memory=True) as prof:
        start = time.perf_counter()
        model(*inputs)
        _synchronize(device)
        profiled_wall_us = (time.perf_counter() - start) * 1e6
    events = list(prof.events())
    cpu = torch.autograd.DeviceType.CPU
    children: dict[int, list] = {}
    for event in events:
        if event.cpu_parent is not None:
            children.setdefault(id(event.cpu_parent), []).append(event)

    def subtree(event):
        stack, out = [event], []
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(children.get(id(node), ()))
        return out

    rows: dict[str, dict] = {}
    kernel_count = 0
    memory = 0
    for event in events:
        if event.device_type != cpu:
            kernel_count += 1
            continue
        if event.name.startswith("[memory]"):
            continue
        usage = event.self_device_memory_usage if device.startswith("cuda") else event.self_cpu_memory_usage
        memory += max(0, int(usage or 0))
        if event.cpu_parent is not None:
            continue
        row = rows.setdefault(
            event.name, {"name": event.name, "count": 0, "cpu_us": 0.0, "device_us": 0.0, "flops": 0}
        )
        row["count"] += 1
        row["cpu_us"] += float(event.cpu_time_total)
        row["device_us"] += float(getattr(event, "device_time_total", 0.0) or 0.0)
        row["flops"] += int(sum((e.flops or 0) for e in subtree(event)))
    return {
        "ops": sorted(rows.values(), key=lambda r: r["name"]),
        "kernel_count": kernel_count,
        "memory_bytes": memory,
        "profiled_wall_us": profiled_wall_us,
    }


def _nvtx(device: str):
    import torch

    if device.startswith("cuda"):
        return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    return (lambda name: None), (lambda: None)


def _build(module, device: str, seed: int, on_device: bool):
    """``Model(*get_init_inputs())`` (as constructed: train mode, like the evaluator) and ``get_inputs()``
    on ``device``, each after ``torch.manual_seed(seed)``. ``on_device``: made under ``torch.device``,
    so parameters and random inputs are created on the GPU (seconds less per task than filling
    gigabytes on the host and copying them; the values differ from a host build, their shapes, dtypes
    and distributions do not, and the kernels profiled are the same)."""
    import torch

    where = torch.device(device) if on_device else contextlib.nullcontext()
    torch.manual_seed(seed)
    with where:
        model = module.Model(*module.get_init_inputs())
    model = model.to(device)
    torch.manual_seed(seed)
    with where:
        inputs = list(module.get_inputs())
    return model, _to_device(inputs, device)


def run_task(task: dict, job: dict, base: Path) -> dict:
    import torch

    device = job.get("device", "cuda")
    seed = int(job.get("seed", 42))
    t0 = time.perf_counter()
    module = _load_module(base / task["path"], f"autoprofiler_task_{task['id']}")
    out: dict = {"ok": False, "error": ""}
    on_device = bool(job.get("build_on_device", device.startswith("cuda")))
    try:
        model, inputs = _build(module, device, seed, on_device)
        out["built_on"] = "device" if on_device else "host"
    except Exception:
        if not on_device:
            raise
        model, inputs = _build(module, device, seed, False)  # a task whose build needs host tensors
        out["built_on"] = "host"
    _synchronize(device)
    t1 = time.perf_counter()
    out["setup_s"] = round(t1 - t0, 3)  # where a profiled run's seconds go (the profiler logs them)
    with torch.no_grad():
        for _ in range(int(job.get("warmup", 3))):
            result = model(*inputs)
        _synchronize(device)
        walls = []
        for _ in range(max(1, int(job.get("timing_calls", 5)))):
            start = time.perf_counter()
            result = model(*inputs)
            _synchronize(device)
            walls.append(time.perf_counter() - start)
        out["wall_us"] = statistics.median(walls) * 1e6
        out["io_bytes"] = _tensor_bytes(inputs) + _tensor_bytes(result)
        out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            b.numel() * b.element_size() for b in model.buffers()
        )
        t2 = time.perf_counter()
        out["calls_s"] = round(t2 - t1, 3)
        if job["mode"] == "ncu" and device.startswith("cuda") and os.environ.get(FREE_CACHE_ENV, "1") != "0":
            del result
            # kernel replay saves the device memory a kernel can reach before its first pass: the
            # caching allocator's idle blocks (the warm-up's temporaries) would only add to it
            torch.cuda.empty_cache()
        if job["mode"] == "ncu" and job.get("range_replay"):  # one range, nothing but the launches in it
            push, pop = _nvtx(device)
            push(f"ap:{task['id']}")
            model(*inputs)
            pop()
            _synchronize(device)
        elif job["mode"] == "ncu":
            push, pop = _nvtx(device)
            push("autoprofiler")
            push(f"ap:{task['id']}")
            model(*inputs)
            _synchronize(device)
            pop()
            pop()
        elif job["mode"] == "torch":
            out.update(_profile_with_torch(model, inputs, device))
        else:
            raise ValueError(f"job mode {job['mode']!r}: expected 'ncu' or 'torch'")
    out["profiled_s"] = round(time.perf_counter() - t2, 3)
    out["ok"] = True
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m autoprofiler.profiling._program JOB.json", file=sys.stderr)
        return 2
    job_path = Path(argv[0]).resolve()
    job = json.loads(job_path.read_text())
    base = job_path.parent
    t0 = time.perf_counter()
    import torch

    device = job.get("device", "cuda")
    result = {
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "tasks": {},
    }
    result["start_s"] = round(time.perf_counter() - t0, 3)  # importing torch, creating the context
    result_path = base / job.get("result", "result.json")
    for task in job["tasks"]:
        try:
            result["tasks"][task["id"]] = run_task(task, job, base)
        except Exception as exc:  # a task's fault becomes data; the other tasks still run
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            result["tasks"][task["id"]] = {
                "ok": False,
                "error": detail,
                "traceback": traceback.format_exc()[-4000:],
            }
            if device.startswith("cuda") and "CUDA error" in detail:
                result_path.write_text(json.dumps(result))
                return 3  # a sticky CUDA error corrupts the context: stop here
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # the next task of the batch gets the memory back
        result_path.write_text(json.dumps(result))
    result_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
