# level: 1
# tags: matmul, test
"""A square fp32 matmul with a seeded weight, long enough that a timer tampered with, or a cache of
outputs, shows well above the noise of the reference process's clock on a loaded machine: 768x768 at
``AUTOPROFILER_TASK_SIZE=small`` (about 5 ms on one core of a 2-CPU machine: a timer hiding 70% of a
call then leaves ~3.5 ms per block unexplained, several times the witness's ~1 ms slack; at 384x384,
0.65 ms a call, the margin was 1.3x and a loaded run missed it), 4096x4096 at full size (a few ms on
the H200)."""

import os

import torch
import torch.nn as nn

N = 768 if os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small" else 4096


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
