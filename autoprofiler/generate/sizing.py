"""A roofline estimate of a generated task's eager forward at full size, and the batch that sizes it.

Every op of a chain costs ``max(flops / peak, bytes / bandwidth) + launches * launch_s``, with flops and
bytes linear in the batch (``spec.py``): so the full batch is chosen last, as the largest batch of the
ladder 2, 3, 4, 6, 8, 12, ... whose estimate stays under a target time (``batch_for_time``), or the
largest batch whose estimated peak memory stays under a target (``batch_for_memory``: the "task of a
chosen size" for memory tests).

The estimate is a sizing aid, not a measurement: the GPU filter (``datasets/ops_gen/filter_gpu.py``)
measures the eager time and keeps the tasks that take 1-100 ms. The device numbers below are rough
sustained rates of an H200 in eager PyTorch (HBM3e peak 4.8 TB/s; fp32 without TF32 ~60 TFLOP/s
peak; dense fp16/bf16 tensor cores ~990 TFLOP/s peak), derated to what eager kernels reach.

Peak memory of one forward under ``torch.no_grad()``: the inputs (held by the caller) + the weights +
the most any one op holds at once (its input, its output, its temporaries); intermediates before it
are freed when ``x`` is rebound.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BATCH = 1 << 20
MAX_TENSOR_ELEMS = 2**31 - 1  # past this some CUDA kernels need 64-bit indexing they do not have


@dataclass(frozen=True)
class DeviceModel:
    """Sustained rates for the estimate (bytes/s, flop/s, s per kernel launch)."""

    bandwidth: float = 3.5e12
    fp32_flops: float = 45e12
    half_flops: float = 500e12
    launch_s: float = 5e-6


H200 = DeviceModel()


@dataclass(frozen=True)
class StepCost:
    """One op at full size. ``flops``, ``moved`` and ``live`` are per sample; ``param_bytes`` is not.

    ``moved``: bytes read and written (input, extra inputs, output, temporaries twice);
    ``live``: bytes the op holds at once (input, output, temporaries).
    """

    flops: float
    matmul: bool
    moved: float
    live: float
    param_bytes: float
    kernels: int


@dataclass(frozen=True)
class TaskCost:
    """The chain's steps plus the per-sample input bytes and the largest per-sample tensor (elements)."""

    steps: tuple[StepCost, ...]
    input_bytes: float
    largest_tensor: int
    low_precision: bool

    @property
    def param_bytes(self) -> float:
        return sum(step.param_bytes for step in self.steps)

    def seconds(self, batch: int, device: DeviceModel = H200) -> float:
        """Estimated eager forward time at ``batch``."""
        peak = device.half_flops if self.low_precision else device.fp32_flops
        total = 0.0
        for step in self.steps:
            compute = batch * step.flops / (peak if step.matmul else device.fp32_flops)
            memory = (batch * step.moved + step.param_bytes) / device.bandwidth
            total += max(compute, memory) + step.kernels * device.launch_s
        return total

    def peak_bytes(self, batch: int) -> float:
        """Estimated peak memory of one forward at ``batch`` (inputs + weights + the largest step)."""
        largest_step = max((step.live for step in self.steps), default=0.0)
        return batch * (self.input_bytes + largest_step) + self.param_bytes

    def max_batch(self, max_tensor_elems: int = MAX_TENSOR_ELEMS) -> int:
        """The largest batch that keeps every tensor within ``max_tensor_elems`` (and ``MAX_BATCH``)."""
        return max(2, min(MAX_BATCH, max_tensor_elems // max(1, self.largest_tensor)))


def batch_ladder(limit: int) -> list[int]:
    """Batch sizes the time sizing picks from: 2, 3, 4, 6, 8, 12, ... (powers of two and 1.5x them).

    >>> batch_ladder(20)
    [2, 3, 4, 6, 8, 12, 16]
    """
    ladder, power = [], 2
    while power <= limit:
        ladder += [b for b in (power, power * 3 // 2) if b <= limit]
        power *= 2
    return ladder


def batch_for_time(
    cost: TaskCost,
    target_s: float,
    max_peak_bytes: float,
    device: DeviceModel = H200,
    max_tensor_elems: int = MAX_TENSOR_ELEMS,
) -> int:
    """The largest ``batch_ladder`` batch (at least 2) whose estimate stays within ``target_s`` and
    whose peak memory stays within ``max_peak_bytes``.

    >>> step = StepCost(flops=0.0, matmul=False, moved=8e6, live=8e6, param_bytes=0.0, kernels=1)
    >>> batch_for_time(TaskCost((step,), 4e6, 1_000_000, False), 1e-3, 8 * 2**30)   # 8 MB/sample, 3.5 TB/s
    384
    """
    chosen = 2
    for batch in batch_ladder(cost.max_batch(max_tensor_elems)):
        if cost.seconds(batch, device) > target_s or cost.peak_bytes(batch) > max_peak_bytes:
            break
        chosen = batch
    return chosen


def batch_for_memory(cost: TaskCost, peak_bytes: float, max_tensor_elems: int = MAX_TENSOR_ELEMS) -> int:
    """The largest batch (at least 2) whose estimated peak memory stays within ``peak_bytes`` (and
    whose tensors stay within ``max_tensor_elems``).

    >>> step = StepCost(flops=0.0, matmul=False, moved=8e6, live=8e6, param_bytes=0.0, kernels=1)
    >>> batch_for_memory(TaskCost((step,), 4e6, 1_000_000, False), 1.2e9)
    100
    """
    per_sample = cost.peak_bytes(1) - cost.param_bytes
    fits = int((peak_bytes - cost.param_bytes) // per_sample) if per_sample > 0 else MAX_BATCH
    return max(2, min(fits, cost.max_batch(max_tensor_elems)))
