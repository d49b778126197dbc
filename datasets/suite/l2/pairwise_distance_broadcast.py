# level: 2
# tags: distance, broadcast, reduction, algorithmic, fp32, memory-bound
"""Pairwise Euclidean distances by broadcasting (N, 1, D) - (1, M, D): materializes an N x M x D
tensor. Expanding ||a||^2 + ||b||^2 - 2 a.b turns it into one GEMM (torch.cdist does)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
N, M, D = (128, 96, 32) if SMALL else (2048, 2048, 128)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        diff = a[:, None, :] - b[None, :, :]
        return torch.sqrt((diff * diff).sum(dim=-1))


def get_inputs():
    return [torch.randn(N, D), torch.randn(M, D)]


def get_init_inputs():
    return []
