# level: 2
# tags: conv, activation, pooling, fusion, fp32, memory-bound
"""Conv2d (3 -> 64 channels, stride 1) + ReLU + 2x2 max pooling. With 3 input channels the conv does
little work per output byte: the large intermediate activations make it memory-bound."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_CH, OUT_CH, H, W = (2, 3, 8, 32, 32) if SMALL else (64, 3, 64, 224, 224)


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH]
