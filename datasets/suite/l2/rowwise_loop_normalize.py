# level: 2
# tags: loop, reduction, elementwise, algorithmic, fp32, latency-bound
"""Per-row normalization in a Python loop: (row - mean) / (std + eps), one row at a time. Hundreds of
tiny kernel launches; vectorizing over rows is the fix."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (16, 128) if SMALL else (256, 4096)


class Model(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = []
        for i in range(x.shape[0]):
            row = x[i]
            rows.append((row - row.mean()) / (row.std() + self.eps))
        return torch.stack(rows)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1e-5]
