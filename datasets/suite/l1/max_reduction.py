# level: 1
# tags: reduction, max, fp32, memory-bound
"""Max reduction over the middle dimension (strided access: reduce across rows of each matrix)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, ROWS, COLS = (8, 256, 256) if SMALL else (128, 1024, 2048)


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.dim).values


def get_inputs():
    return [torch.randn(BATCH, ROWS, COLS)]


def get_init_inputs():
    return [1]
