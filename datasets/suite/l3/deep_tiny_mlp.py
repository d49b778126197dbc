# level: 3
# tags: mlp, linear, tiny, fp32, latency-bound
"""Sixteen narrow Linear+ReLU layers on a small batch: each GEMM is microseconds, so launch
overhead dominates (CUDA graphs or one fused kernel help)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, WIDTH = (8, 64) if SMALL else (32, 256)
DEPTH = 16


class Model(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def get_inputs():
    return [torch.randn(BATCH, WIDTH)]


def get_init_inputs():
    return [WIDTH, DEPTH]
