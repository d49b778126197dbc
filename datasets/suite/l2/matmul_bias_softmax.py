# level: 2
# tags: matmul, softmax, fusion, fp32, compute-bound
"""Logits = x @ W + b, then a row softmax: GEMM followed by a memory-bound reduction."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_FEATURES, CLASSES = (128, 256, 1000) if SMALL else (4096, 2048, 32000)


class Model(nn.Module):
    def __init__(self, in_features: int, classes: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, classes) / in_features**0.5)
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ self.weight + self.bias, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, CLASSES]
