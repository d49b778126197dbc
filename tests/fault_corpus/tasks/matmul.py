# level: 1
# tags: matmul, tiny, test
"""Tiny matmul with a seeded weight: x (16, n) @ W (n, n). ModelNew must build W under the same seed."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return [32]
