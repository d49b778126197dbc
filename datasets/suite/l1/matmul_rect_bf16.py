# level: 1
# tags: matmul, bf16, compute-bound
"""Rectangular bf16 matrix multiplication (M x K) @ (K x N), tensor-core sized. Full: 8192x4096x8192."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
M, K, N = (256, 128, 192) if SMALL else (8192, 4096, 8192)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return A @ B


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
