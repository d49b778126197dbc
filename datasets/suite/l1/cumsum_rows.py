# level: 1
# tags: scan, cumsum, fp32, memory-bound
"""Inclusive prefix sum along the last dimension (a scan: sequential dependency along the row)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (256, 1024) if SMALL else (4096, 32768)


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [-1]
