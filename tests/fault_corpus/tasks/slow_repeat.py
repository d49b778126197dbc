# level: 1
# tags: matmul, tiny, test
"""A wasteful reference: the same 64x64 matmul 100 times. A correct candidate doing it once is ~100x faster."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        y = None
        for _ in range(100):
            y = torch.mm(x, w)
        return y


def get_inputs():
    return [torch.randn(64, 64), torch.randn(64, 64)]


def get_init_inputs():
    return []
