# level: 1
# tags: conv, fp32, compute-bound
"""Standard 3x3 convolution, stride 1, padding 1 (ResNet stage-2 sized at full)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_CH, OUT_CH, H, W = (4, 16, 32, 32, 32) if SMALL else (32, 128, 128, 56, 56)
KERNEL = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH, KERNEL]
