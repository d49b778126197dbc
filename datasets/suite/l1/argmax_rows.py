# level: 1
# tags: reduction, argmax, fp32, memory-bound
"""Argmax over the last dimension (integer output: exact match required)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (512, 1024) if SMALL else (32768, 8192)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
