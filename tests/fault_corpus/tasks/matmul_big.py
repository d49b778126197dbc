# level: 1
# tags: matmul, test
"""A square fp32 matmul with a seeded weight, long enough that a timer tampered with, or a cache of
outputs, shows well above the noise of the reference process's clock on a loaded machine: 384x384 at
``AUTOPROFILER_TASK_SIZE=small`` (3-4 ms on one core of the 2-CPU CI machine), 4096x4096 at full size
(a few ms on the H200)."""

import os

import torch
import torch.nn as nn

N = 384 if os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small" else 4096


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(N, N)]


def get_init_inputs():
    return [N]
