# level: 1
# tags: conv, depthwise, fp32, memory-bound
"""Depthwise 3x3 convolution (groups = channels): little reuse per byte, usually memory-bound."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, CHANNELS, H, W = (4, 32, 32, 32) if SMALL else (32, 256, 112, 112)
KERNEL = 3


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(
            channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, H, W)]


def get_init_inputs():
    return [CHANNELS, KERNEL]
