# level: 1
# tags: pooling, fp16, memory-bound
"""2x2 average pooling, stride 2, on an fp16 feature map."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, CHANNELS, H, W = (4, 16, 64, 64) if SMALL else (64, 256, 112, 112)


class Model(nn.Module):
    def __init__(self, kernel_size: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size, stride=kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, H, W, dtype=torch.float16)]


def get_init_inputs():
    return [2]
