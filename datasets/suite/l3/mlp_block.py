# level: 3
# tags: mlp, matmul, layernorm, activation, residual, fp32, compute-bound
"""Transformer MLP block: x + W2 GELU(W1 LayerNorm(x)), hidden 4x."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
TOKENS, DIM = (64, 128) if SMALL else (8192, 2048)


class Model(nn.Module):
    def __init__(self, dim: int, expansion: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, dim * expansion)
        self.down = nn.Linear(dim * expansion, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def get_inputs():
    return [torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return [DIM, 4]
