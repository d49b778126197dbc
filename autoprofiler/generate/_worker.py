"""The worker process that runs generated tasks for the generator's checks (started by ``pool.py``).

Generated code is untrusted by policy, like any task: it runs here, in a process of its own with a
scrubbed environment, a temp dir as its home and working directory, a memory limit on the CPU and a
wall-clock limit enforced by the driver (which kills the process group). This file is run by path and
imports only the standard library and torch, never the ``autoprofiler`` package.

Protocol: one JSON job per line on stdin, one JSON result per line on the original stdout (the task's
own prints go to stderr). The worker first writes ``{"ready": true}`` once torch is imported.

Jobs (``job["kind"]``):
- ``cpu_check``: at size ``small``: build, run, output shape/dtype as predicted, finite, not
  constant, deterministic (a second build and run from the same seed gives identical outputs), the
  output changes with the inputs; then at size ``full`` on the ``meta`` device (no memory): builds,
  runs, output shape as predicted.
- ``gpu_time``: at the job's size on the job's device: builds, runs, finite, deterministic, then the
  median eager time of ``repeats`` forwards after ``warmup`` (CUDA events on a GPU) and the peak memory
  of building and one forward (``torch.cuda.max_memory_allocated``; on the CPU the increase of the
  resident-set high-water mark).
- ``compile``: eager output, then ``torch.compile(model, backend=...)`` runs twice; records the
  compile time and the largest difference from eager.

A result is ``{"ok": true, ...measurements}`` or ``{"ok": false, "kind": <reason kind>, "reason": <text>}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


class Reject(Exception):
    """A task failed a check: ``kind`` is the short reason kind, the message says what happened."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def kind_of(exc: BaseException, default: str) -> str:
    """``oom`` for an out-of-memory error (a GPU filter retries those alone), else ``default``."""
    return "oom" if "out of memory" in str(exc).lower() else default


def describe(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load(source: str, size: str) -> dict:
    """Execute the task source in a fresh namespace with ``AUTOPROFILER_TASK_SIZE=size``."""
    os.environ["AUTOPROFILER_TASK_SIZE"] = size
    namespace = {"__name__": "_generated_task"}
    try:
        exec(compile(source, "<generated task>", "exec"), namespace)
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if name not in namespace:
                raise NameError(f"the task defines no {name}")
    except Exception as exc:
        raise Reject("build_error", f"loading at size {size}: {describe(exc)}") from None
    return namespace


def build(torch, task: dict, seed: int, input_seed: int, device: str):
    """``Model(*get_init_inputs())`` under ``seed``, ``get_inputs()`` under ``input_seed``, on ``device``."""
    try:
        torch.manual_seed(seed)
        with torch.device(device):
            model = task["Model"](*task["get_init_inputs"]())
        return model, make_inputs(torch, task, input_seed, device)
    except Reject:
        raise
    except Exception as exc:
        raise Reject(kind_of(exc, "build_error"), f"building the model or inputs: {describe(exc)}") from None


def make_inputs(torch, task: dict, seed: int, device: str) -> list:
    torch.manual_seed(seed)
    with torch.device(device):
        return list(task["get_inputs"]())


def forward(torch, model, inputs: list, what: str = "forward"):
    try:
        with torch.no_grad():
            out = model(*inputs)
    except Exception as exc:
        raise Reject(kind_of(exc, "run_error"), f"{what}: {describe(exc)}") from None
    if not isinstance(out, torch.Tensor):
        raise Reject("run_error", f"{what}: the output is a {type(out).__name__}, expected one tensor")
    return out


def check_values(torch, out, what: str) -> None:
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        raise Reject("nonfinite", f"{what}: the output has NaN or Inf")


def dtype_name(torch, dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "int64"}.get(
        dtype, str(dtype).replace("torch.", "")
    )


def cpu_check(torch, job: dict) -> dict:
    seed = int(job.get("seed", 0))
    task = load(job["source"], "small")
    model, inputs = build(torch, task, seed, seed, "cpu")
    out = forward(torch, model, inputs)
    if list(out.shape) != list(job["small_shape"]):
        raise Reject(
            "shape_mismatch", f"small output shape {list(out.shape)}, predicted {job['small_shape']}"
        )
    if dtype_name(torch, out.dtype) != job["output_dtype"]:
        raise Reject("dtype_mismatch", f"output dtype {out.dtype}, predicted {job['output_dtype']}")
    check_values(torch, out, "small forward")
    if out.numel() > 1 and bool(out.max() == out.min()):
        raise Reject("constant_output", f"every output element equals {out.flatten()[0].item()!r}")
    again_model, again_inputs = build(torch, task, seed, seed, "cpu")
    again = forward(torch, again_model, again_inputs, "second forward")
    if not torch.equal(out, again):
        diff = (out.double() - again.double()).abs().max().item()
        raise Reject("nondeterministic", f"two runs from seed {seed} differ (max abs diff {diff:.3g})")
    other = forward(torch, model, make_inputs(torch, task, seed + 1, "cpu"), "forward on other inputs")
    if torch.equal(out, other):
        raise Reject("ignores_inputs", "the output is the same for inputs drawn from two seeds")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        forward(torch, model, inputs)
        times.append(time.perf_counter() - start)
    full = load(job["source"], "full")
    try:
        meta_model, meta_inputs = build(torch, full, seed, seed, "meta")
        meta_out = forward(torch, meta_model, meta_inputs, "full-size forward (meta)")
    except Reject as reject:
        raise Reject("full_size_error", str(reject)) from None
    if list(meta_out.shape) != list(job["full_shape"]):
        raise Reject(
            "full_shape_mismatch", f"full output shape {list(meta_out.shape)}, predicted {job['full_shape']}"
        )
    return {"small_ms": round(statistics.median(times) * 1e3, 4)}


def synchronize(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_forwards(torch, model, inputs: list, device: str, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` forwards (CUDA events on a GPU, the wall clock elsewhere)."""
    seconds = []
    with torch.no_grad():
        for _ in range(repeats):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(*inputs)
                end.record()
                end.synchronize()
                seconds.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                model(*inputs)
                seconds.append(time.perf_counter() - t0)
    return seconds


def gpu_time(torch, job: dict) -> dict:
    device, seed = job["device"], int(job.get("seed", 0))
    task = load(job["source"], job["size"])
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    rss_before = max_rss_bytes()
    model, inputs = build(torch, task, seed, seed, device)
    out = forward(torch, model, inputs)
    synchronize(torch, device)
    peak = torch.cuda.max_memory_allocated(device) if cuda else max_rss_bytes() - rss_before
    out = out.clone()
    check_values(torch, out, f"{job['size']} forward")
    del model, inputs
    model, inputs = build(torch, task, seed, seed, device)
    again = forward(torch, model, inputs, "second forward")
    if not torch.equal(out, again):
        diff = (out.double() - again.double()).abs().max().item()
        raise Reject(
            "nondeterministic", f"two runs from seed {seed} differ on {device} (max abs diff {diff:.3g})"
        )
    del out, again
    try:
        timed_forwards(torch, model, inputs, device, int(job.get("warmup", 3)))
        seconds = timed_forwards(torch, model, inputs, device, int(job.get("repeats", 10)))
    except Exception as exc:
        raise Reject(kind_of(exc, "run_error"), f"timed forwards: {describe(exc)}") from None
    return {
        "eager_ms": round(statistics.median(seconds) * 1e3, 4),
        "eager_min_ms": round(min(seconds) * 1e3, 4),
        "peak_gib": round(peak / 2**30, 4),
        "peak_source": "torch.cuda.max_memory_allocated" if cuda else "ru_maxrss increase",
        "gpu": torch.cuda.get_device_name(device) if cuda else "",  # the 1-100 ms window is per card
    }


def max_rss_bytes() -> int:
    """This process's resident-set high-water mark (Linux reports KiB). On the CPU the increase over a
    job is the job's peak only in a fresh worker (``WorkerPool(recycle_after=1)``)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def compile_check(torch, job: dict) -> dict:
    device, seed = job["device"], int(job.get("seed", 0))
    task = load(job["source"], job["size"])
    model, inputs = build(torch, task, seed, seed, device)
    eager = forward(torch, model, inputs).clone()
    try:
        start = time.perf_counter()
        compiled = torch.compile(model, backend=job.get("backend", "inductor"))
        with torch.no_grad():
            first = compiled(*inputs)
            synchronize(torch, device)
            compile_s = time.perf_counter() - start
            second = compiled(*inputs)
            synchronize(torch, device)
    except Exception as exc:
        raise Reject(
            kind_of(exc, "compile_error"),
            f"torch.compile(backend={job.get('backend', 'inductor')!r}): {describe(exc)}",
        ) from None
    if not isinstance(first, torch.Tensor) or first.shape != eager.shape:
        raise Reject("compile_error", "the compiled model gives another output shape")
    diffs = []
    for out in (first, second):
        if out.is_floating_point():
            error = (out.double() - eager.double()).abs()
            diffs.append((error.max().item(), (error.norm() / eager.double().norm().clamp_min(1e-30)).item()))
        else:
            diffs.append((float((out != eager).sum().item()), 0.0))
    return {
        "compile_s": round(compile_s, 3),
        "max_abs_diff": max(d[0] for d in diffs),
        "rel_norm_diff": max(d[1] for d in diffs),
    }


JOBS = {"cpu_check": cpu_check, "gpu_time": gpu_time, "compile": compile_check}


def run_job(torch, job: dict) -> dict:
    try:
        result = JOBS[job["kind"]](torch, job)
        return {"ok": True, **result}
    except Reject as reject:
        return {"ok": False, "kind": reject.kind, "reason": str(reject)}
    except Exception as exc:  # a bug in a check, or an exception type the checks do not expect
        return {"ok": False, "kind": "worker_error", "reason": describe(exc)}


def set_limits(memory_limit_gb: float, device: str) -> None:
    """No core files; on the CPU an address-space limit (CUDA reserves far more address space than it
    uses, so no limit there)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_gb > 0 and device == "cpu":
        limit = int(memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-limit-gb", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-fraction", type=float, default=0.0)
    args = parser.parse_args()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the task's prints go to the log, not into the protocol
    sys.stdout = sys.stderr
    set_limits(args.memory_limit_gb, args.device)
    import torch

    torch.set_num_threads(max(1, args.threads))
    if args.device.startswith("cuda") and args.memory_fraction > 0:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, torch.device(args.device))
    protocol.write(json.dumps({"ready": True, "torch": torch.__version__}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        result = run_job(torch, job)
        result["id"] = job.get("id")
        protocol.write(json.dumps(result, allow_nan=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
