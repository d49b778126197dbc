# level: 1
# tags: matmul, test
"""A 4096^2 fp32 matmul (for the GPU tests: long enough that side-stream tricks show in the timing)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(4096, 4096), torch.randn(4096, 4096)]


def get_init_inputs():
    return []
