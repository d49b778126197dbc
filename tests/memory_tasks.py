"""Tasks sized by memory, for the evaluator's memory plan (``tests/test_evaluation_memory*.py``).

Each builder writes a KernelBench-form task with its shape baked in (the same in both evaluation
processes), so a test can size it from the device it runs on: the CPU tests use a few MiB to tens of
MiB, the GPU test a quarter of the H200's memory. Imports only the standard library and
``autoprofiler.tasks`` (the H200 image has neither ray nor polars).
"""

from __future__ import annotations

import math

from autoprofiler.tasks import Task

RMSNORM = '''# level: 1
# tags: norm, rmsnorm, memory, test
"""RMSNorm over the channels of a ({b}, {c}, {h}, {w}) fp32 tensor ({gib:.3g} GiB): one forward holds the
input and the output (the square is freed before the output is made, the weight multiply is in place)."""

import torch
import torch.nn as nn

SHAPE = ({b}, {c}, {h}, {w})


class Model(nn.Module):
    def __init__(self, channels, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(channels) + 0.5)
        self.eps = eps

    def forward(self, x):
        scale = torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + self.eps)
        return torch.mul(x, scale).mul_(self.weight.view(1, -1, 1, 1))


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [SHAPE[1], 1e-5]
'''

ROW_SUM = '''# level: 1
# tags: reduction, memory, test
"""Row sums of a ({rows}, {cols}) fp32 tensor ({gib:.3g} GiB): large inputs, a small output."""

import torch
import torch.nn as nn

SHAPE = ({rows}, {cols})


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
'''

PROJECTION = '''# level: 1
# tags: matmul, memory, test
"""A ({rows}, {cols}) fp32 input ({gib:.3g} GiB) projected to {out} columns: large inputs, a small output
and enough arithmetic per call that a cache of outputs (memoization) would pay off."""

import torch
import torch.nn as nn

SHAPE = ({rows}, {cols})


class Model(nn.Module):
    def __init__(self, cols, out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cols, out) / cols**0.5)

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [SHAPE[1], {out}]
'''


def rmsnorm_task(input_bytes: int, channels: int = 64, side: int = 512) -> Task:
    """An RMSNorm task (as in issue 11: (112, 64, 512, 512) fp32 is 7.5 GB) whose fp32 input is about
    ``input_bytes``: the batch is chosen, and for small sizes the spatial side shrinks first.

    >>> rmsnorm_task(8 * 2**20).source.count("SHAPE = (2, 64, 128, 128)")
    1
    """
    per_sample = channels * side * side * 4
    while side > 8 and input_bytes < 2 * per_sample:
        side //= 2
        per_sample = channels * side * side * 4
    batch = max(1, round(input_bytes / per_sample))
    gib = batch * per_sample / 2**30
    source = RMSNORM.format(b=batch, c=channels, h=side, w=side, gib=gib)
    return Task.from_source(f"tests/rmsnorm_{batch}x{channels}x{side}x{side}", source, level=1)


def row_sum_task(input_bytes: int, cols: int = 4096) -> Task:
    """Row sums over an fp32 input of about ``input_bytes``: the timing input sets dominate memory.

    >>> row_sum_task(2**24).source.count("SHAPE = (1024, 4096)")
    1
    """
    rows = max(1, math.ceil(input_bytes / (cols * 4)))
    source = ROW_SUM.format(rows=rows, cols=cols, gib=rows * cols * 4 / 2**30)
    return Task.from_source(f"tests/row_sum_{rows}x{cols}", source, level=1)


def projection_task(input_bytes: int, cols: int = 2048, out: int = 64) -> Task:
    """``x @ W`` with ``x`` an fp32 input of about ``input_bytes`` and ``W`` (cols, out).

    >>> projection_task(2**25).source.count("SHAPE = (4096, 2048)")
    1
    """
    rows = max(1, math.ceil(input_bytes / (cols * 4)))
    source = PROJECTION.format(rows=rows, cols=cols, out=out, gib=rows * cols * 4 / 2**30)
    return Task.from_source(f"tests/projection_{rows}x{cols}x{out}", source, level=1)
