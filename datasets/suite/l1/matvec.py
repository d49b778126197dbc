# level: 1
# tags: matmul, gemv, fp32, memory-bound
"""Matrix-vector product y = A @ x: reads the whole matrix once, 2 FLOP per element (memory-bound)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
M, K = (1024, 1024) if SMALL else (16384, 16384)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, x)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
