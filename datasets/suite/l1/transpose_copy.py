# level: 1
# tags: copy, transpose, layout, fp32, memory-bound
"""Materialized transpose of the last two dims: a strided copy (uncoalesced reads or writes if naive)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, ROWS, COLS = (4, 256, 192) if SMALL else (16, 4096, 4096)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2).contiguous()


def get_inputs():
    return [torch.randn(BATCH, ROWS, COLS)]


def get_init_inputs():
    return []
