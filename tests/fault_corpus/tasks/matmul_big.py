# level: 1
# tags: matmul, test
"""A 384x384 fp32 matmul with a seeded weight (3-4 ms on one core of the 2-CPU CI machine): long enough
that a timer tampered with, or a cache of outputs, shows well above the noise of the reference
process's clock on a loaded machine."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(384, 384)]


def get_init_inputs():
    return [384]
