# level: 2
# tags: conv, batchnorm, activation, fusion, fp32, compute-bound
"""Conv2d + BatchNorm2d + ReLU. The model is used as constructed (training mode), so BatchNorm
normalizes with the batch statistics: deterministic, and the output does not depend on running stats."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_CH, OUT_CH, H, W = (2, 8, 16, 16, 16) if SMALL else (32, 64, 128, 56, 56)


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH]
