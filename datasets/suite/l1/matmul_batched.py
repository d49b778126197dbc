# level: 1
# tags: matmul, batched, fp32, compute-bound
"""Batched matrix multiplication torch.bmm over B independent (M x K) @ (K x N) products."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, M, K, N = (8, 64, 64, 64) if SMALL else (128, 512, 256, 512)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
