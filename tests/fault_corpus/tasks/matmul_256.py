# level: 1
# tags: matmul, test
"""A 256x256 fp32 matmul with a seeded weight (about a millisecond on one CPU core): long enough that a
timer tampered with, or a cache of outputs, shows against the reference process's clock."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return [256]
