# level: 2
# tags: scan, cumsum, matmul, algorithmic, fp32, compute-bound
"""Prefix sum computed as x @ U with U upper-triangular ones: O(n^2) work per row where a scan
(torch.cumsum) needs O(n). An algorithm change, not a faster kernel, is the win."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (256, 256) if SMALL else (16384, 2048)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        upper = torch.triu(torch.ones(n, n, device=x.device, dtype=x.dtype))
        return x @ upper


def get_inputs():
    # positive increments (running totals): a rewrite to a true scan rounds differently, and positive
    # partial sums keep that difference within a relative tolerance
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
