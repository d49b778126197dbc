# level: 2
# tags: elementwise, tiny, fusion, fp32, latency-bound
"""Ten elementwise ops on a small tensor: each kernel launch costs more than its work, so the
chain is bounded by launch latency (one fused kernel or a CUDA graph fixes it)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, COLS = (16, 32) if SMALL else (64, 256)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = x * y
        z = z + x
        z = torch.tanh(z)
        z = z * 0.5 + 0.5
        z = z - y
        z = torch.abs(z)
        z = torch.sqrt(z + 1.0)
        z = torch.exp(-z)
        return z * x + y


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
