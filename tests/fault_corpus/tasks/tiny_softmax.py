# level: 1
# tags: softmax, tiny, test
"""Softmax over 20000 nearly equal logits: every output is about 5e-5, below the fp32 atol of 1e-4."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [0.01 * torch.randn(2, 20000)]


def get_init_inputs():
    return []
