# level: 1
# tags: elementwise, activation, fp32, memory-bound
"""ReLU on a large tensor: one read, one write per element (pure bandwidth)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (1024, 1024) if SMALL else (16384, 16384)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
