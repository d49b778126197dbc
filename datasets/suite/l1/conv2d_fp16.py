# level: 1
# tags: conv, fp16, compute-bound
"""3x3 convolution in fp16 (tensor cores on the GPU), 256 -> 256 channels."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, CHANNELS, H, W = (2, 8, 16, 16) if SMALL else (64, 256, 56, 56)


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, H, W, dtype=torch.float16)]


def get_init_inputs():
    return [CHANNELS]
