# level: 1
# tags: elementwise, activation, bf16, memory-bound
"""Exact (erf) GELU on a bf16 tensor."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (256, 1024) if SMALL else (16384, 16384)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
