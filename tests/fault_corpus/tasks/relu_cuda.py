# level: 1
# tags: elementwise, test
"""ReLU over 16M floats (for the GPU tests; 64 MB in, 64 MB out)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []
