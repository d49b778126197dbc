# level: 1
# tags: sort, topk, algorithmic, fp32, memory-bound
"""Top-k values per row computed by sorting the whole row and slicing: O(n log n) for a k << n
selection that torch.topk (or a partial selection) does far cheaper."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS, K = (64, 512, 8) if SMALL else (8192, 16384, 16)


class Model(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, _ = torch.sort(x, dim=-1, descending=True)
        return values[:, : self.k]


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [K]
